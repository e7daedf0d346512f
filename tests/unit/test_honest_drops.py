"""Honest peers are never shut out for what they could not do: drops that say nothing about a
sender's honesty are no faults, a completion cut mid-character is sent as its faithful prefix, and
`send_text = auto` sends text before any peer's tokenizer is known."""

from __future__ import annotations

from pathlib import Path

from protocol.validate import TOKENIZER_MISMATCH, ValidationLimits, validate_group
from swarm_node.peers.ledger import PeerLedger
from swarm_node.policy.pieces import byte_level_alphabet, completion_text, faithful_prefix
from swarm_node.policy.tiny import build_tiny_tokenizer
from swarm_node.swarm.admission import EXCLUDED, HONEST_REASONS, Reputation, is_fault
from swarm_node.swarm.memory import MemorySwarm
from swarm_node.swarm.tokenizers import TokenizerCensus
from tests.unit.test_node_loop import make_node
from tests.unit.test_send_text import answer_with, capture_published


def byte_token(tok, b: int) -> int:
    """The id of the single-byte token of byte `b` in a byte-level tokenizer."""
    char = {v: k for k, v in byte_level_alphabet().items()}[b]
    return int(tok.convert_tokens_to_ids(char))


def test_honest_drops_are_no_faults_but_are_counted() -> None:
    rep = Reputation()
    ledger = PeerLedger(reputation=rep, clock=lambda: 100.0)
    for _ in range(50):
        for reason in sorted(HONEST_REASONS):
            ledger.record_group("slow", reason, "fp-c")
            rep.record("slow", reason)
    assert not rep.excluded("slow") and rep.faults.get("slow", 0.0) == 0.0
    assert not is_fault(TOKENIZER_MISMATCH) and not is_fault("stale") and not is_fault(None)
    assert is_fault("wrong_prompt") and not is_fault(EXCLUDED)
    for _ in range(8):  # a real fault still excludes
        rep.record("liar", "wrong_prompt")
    assert rep.excluded("liar")
    _, receipts = ledger.receipts(max_senders=4)
    dropped = dict(next(r for r in receipts if r.sender == "slow").dropped)
    assert dropped == {TOKENIZER_MISMATCH: 50, "stale": 50}  # the sender reads why in its receipts


def test_faithful_prefix_trims_a_cut_character() -> None:
    tok = build_tiny_tokenizer("c")
    ids = tok.encode("x = 4", add_special_tokens=False)
    e_acute = [byte_token(tok, 0xC3), byte_token(tok, 0xA9)]  # "\u00e9" in two byte tokens
    whole = [*ids, *e_acute]
    assert completion_text(tok, whole) is not None
    assert faithful_prefix(tok, whole)[0] == len(whole)  # faithful as it is: nothing trimmed
    cut = [*ids, e_acute[0]]  # the token cap fell inside the character
    assert completion_text(tok, cut) is None
    k, text, pieces = faithful_prefix(tok, cut)
    assert k == len(ids) and text == "x = 4" and pieces.shape == (k,) and int(pieces.sum()) == 5
    stray = [*ids, byte_token(tok, 0x01), *ids]  # a forbidden control byte inside: cut before it
    k, text, _ = faithful_prefix(tok, stray)
    assert k == len(ids) and text == "x = 4"
    assert faithful_prefix(tok, [byte_token(tok, 0xA9), *ids]) is None  # nothing faithful to keep


def test_census_wants_text_until_a_peer_is_known() -> None:
    census = TokenizerCensus("mine", ttl_s=100.0)
    assert census.wants_text(0.0)  # nothing read yet: a peer of another tokenizer may be starting
    census.note("mine", 1.0, from_peer=False)  # this node's own status record
    assert census.wants_text(1.0)
    census.note("mine", 2.0)  # a peer of the same tokenizer
    assert not census.wants_text(2.0)
    census.note("theirs", 3.0)
    assert census.wants_text(3.0)
    assert not census.wants_text(200.0)  # "theirs" forgotten, a peer is known


def cut_answers(node) -> None:
    """Make `node` generate completions whose last token cuts "\u00e9" in two (the token cap)."""
    answer_with(node, lambda tok, k: tok.encode(f"x = {k}", add_special_tokens=False) + [byte_token(tok, 0xC3)] * (k == 0),
                -1.0, "length")


def test_one_cut_completion_does_not_silence_its_group(tmp_path: Path) -> None:
    swarm = MemorySwarm()
    a = make_node(tmp_path, swarm, "A", extra=['swarm.send_text="always"'])
    cut_answers(a)
    sent = capture_published(a)
    m = a.run_step()
    assert m["text_groups"] == 2 and m["text_withheld"] == 0
    tok = a.parts.policy.tokenizer
    for g in sent:
        assert all(c.has_text for c in g.completions)
        assert validate_group(g, ValidationLimits(vocab_size=len(tok))) == []
        first = g.completions[0]  # the cut one: sent without its partial character
        assert first.text == "x = 0" and first.token_ids.tolist() == tok.encode("x = 0", add_special_tokens=False)
        assert first.logprobs.shape == first.token_ids.shape and first.finish_reason == "length"
        assert [c.text for c in g.completions[1:]] == ["x = 1", "x = 2", "x = 3"]


def test_groups_without_text_never_exclude_their_sender(tmp_path: Path) -> None:
    """The reported case: a sender of another tokenizer that sends no text is dropped as
    `tokenizer_mismatch` every step, counted by reason, and never excluded."""
    swarm = MemorySwarm()
    b = make_node(tmp_path, swarm, "B", model="tiny-random:64x1:c", extra=['swarm.send_text="never"'])
    a = make_node(tmp_path, swarm, "A")
    mismatches = 0
    for _ in range(8):
        b.run_step()
        m = a.run_step()
        mismatches += int(m.get("dropped_tokenizer_mismatch", 0))
        assert m.get(f"dropped_{EXCLUDED}", 0) == 0
    assert mismatches >= 7  # more drops than once excluded the sender
    assert not a.parts.admission.reputation.excluded("B")
    assert a.parts.admission.reputation.faults.get("B", 0.0) == 0.0
    row = {r["peer_id"]: r for r in a.parts.ledger.rows()}["B"]
    assert row["dropped_by_reason"].get(TOKENIZER_MISMATCH, 0) == mismatches
