"""The order and the verdict of a record's checks (swarm/group_checks.py, swarm/verdicts.py): every reason
is kept, consistency comes before age, an honest reason hides no fault."""

from __future__ import annotations

import pytest

from protocol import codec, keys
from protocol.messages import IndexEntry
from protocol.validate import ValidationLimits
from swarm_node.swarm.admission import Admission, PromptAssignment
from swarm_node.swarm.group_checks import RecordChecks
from swarm_node.swarm.verdicts import is_fault, verdict_reason
from protocol.binding import select_prompts

WS = 30.0
T0 = 3_000_000.0
W = keys.window_of(T0, WS)
PROMPTS = PromptAssignment(prompt_set_id="ps", set_size=50, prompts_per_step=2, salt="s", window_seconds=WS,
                           slots_per_window=4)


def checks(admission: Admission | None = None) -> RecordChecks:
    limits = ValidationLimits(vocab_size=100, max_group_size=8, expected_tokenizer_fingerprint="mine")
    return RecordChecks(limits, WS, 8 << 20, 16 << 20, codec.Limits(), set(), admission)


def entry(t: float, index: int = 0, **declared) -> IndexEntry:
    return IndexEntry(chunk_digests=("ab" * 32,), size=1000, prompt_index=index, policy_version=0, created_at=t,
                      **declared)


def test_stale_only_for_a_consistent_record() -> None:
    c = checks()
    late = T0 - 5 * WS  # 5 windows before the current one, beyond a staleness of 2
    # Listed in the index of its own (old) window: consistent and merely late, an honest drop.
    assert c.entry_reasons("p", entry(late), keys.window_of(late, WS), W, 2) == ["stale"]
    # Listed in the current window's index with that old time: a time that contradicts its index.
    assert c.entry_reasons("p", entry(late), W, W, 2) == ["index_mismatch"]
    assert c.entry_reasons("p", entry(float("nan")), W, W, 2) == ["bad_timestamp"]
    assert c.entry_reasons("p", entry(T0), W, W, 2) == []


def test_every_reason_is_kept_and_the_verdict_is_the_first_fault() -> None:
    c = checks()
    both = entry(T0, tokenizer_fingerprint="theirs", has_text=False, group_size=16)
    reasons = c.entry_reasons("p", both, W, W, 2)
    assert reasons == ["group_too_large", "tokenizer_mismatch"]
    assert verdict_reason(reasons) == "group_too_large" and verdict_reason(["tokenizer_mismatch", "stale"]) == \
        "tokenizer_mismatch"
    assert verdict_reason(["tokenizer_mismatch", "wrong_prompt"]) == "wrong_prompt"
    assert not is_fault("tokenizer_mismatch") and not is_fault("verify_budget") and is_fault("index_mismatch")
    with pytest.raises(ValueError):
        verdict_reason([])
    usable = entry(T0, tokenizer_fingerprint="theirs", has_text=True, group_size=4)  # cross-tokenizer off here
    assert c.entry_reasons("p", usable, W, W, 2) == ["tokenizer_mismatch"]
    c.limits = ValidationLimits(vocab_size=100, expected_tokenizer_fingerprint="mine", cross_tokenizer=True)
    assert c.entry_reasons("p", usable, W, W, 2) == []


def test_an_honest_reason_does_not_hide_a_wrong_prompt() -> None:
    """Another tokenizer (honest) on a prompt its sender was not assigned: the binding is still checked,
    without holding a place of the sender's quota."""
    adm = Admission(prompts=PROMPTS)
    c = checks(adm)
    mine = select_prompts("p", W, 8, 50, salt="s")
    other = next(i for i in range(50) if i not in mine)
    foreign = {"tokenizer_fingerprint": "theirs", "has_text": False, "group_size": 4}
    assert c.entry_reasons("p", entry(T0, other, **foreign), W, W, 2) == ["tokenizer_mismatch", "wrong_prompt"]
    assert c.entry_reasons("p", entry(T0, mine[0], **foreign), W, W, 2) == ["tokenizer_mismatch"]
    # That honest drop held no place: the prompt's one place in the window is still free.
    assert c.entry_reasons("p", entry(T0, mine[0]), W, W, 2) == []
    assert c.entry_reasons("p", entry(T0 + 1, mine[0]), W, W, 2) == ["window_slot_overused"]
