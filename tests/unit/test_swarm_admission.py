"""Admission rules (swarm/admission.py, swarm/allowlist.py): one test per rule, on hand-built groups."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import pytest

from protocol import keys
from protocol.messages import Completion, PromptRef, RolloutGroup, SamplingParams
from swarm_node.swarm.admission import (
    DUPLICATE,
    EXCLUDED,
    GROUP_SIZE_CHANGED,
    MIN_FINGERPRINT_TOKENS,
    NOT_ALLOWED,
    OVER_TOKEN_BUDGET,
    SLOT_OVERUSED,
    WRONG_PROMPT,
    Admission,
    PromptAssignment,
    Reputation,
    fair_sample,
)
from protocol.binding import select_prompts

SALT = "adm-swarm"
PROMPTS = PromptAssignment(prompt_set_id="ps-1", set_size=50, prompts_per_step=2, salt=SALT, window_seconds=30.0,
                           slots_per_window=4)


@dataclass
class Cand:
    owner: str
    n: int


def _group(sender: str, index: int, version: int = 0, g: int = 4, seed: int = 0, tokens: int = 3,
           created_at: float = 100.0) -> RolloutGroup:
    rng = np.random.default_rng(seed)
    return RolloutGroup(
        swarm_id=SALT, sender=sender, model_id="m", model_revision="", tokenizer_fingerprint="fp",
        policy_version=version, created_at=created_at, prompt=PromptRef(prompt_set_id="ps-1", index=index, sha256="0" * 64),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16),
        completions=tuple(Completion(token_ids=rng.integers(0, 1000, tokens).astype(np.uint32),
                                     logprobs=np.full(tokens, -1.0, np.float32), finish_reason="stop",
                                     claimed_reward=0.0) for _ in range(g)))


def _assigned(sender: str, created_at: float = 100.0) -> list[int]:
    """The prompts `sender` may publish in the window of `created_at`: n x S = 2 x 4 of them."""
    return select_prompts(sender, keys.window_of(created_at, 30.0), 8, 50, salt=SALT)


def test_fair_sample_is_fair_over_identities_first() -> None:
    # One peer lists 100 groups, three list 2: with room for 8, every identity gets 2.
    cands = [Cand("flood", i) for i in range(100)] + [Cand(p, i) for p in ("a", "b", "c") for i in range(2)]
    for seed in range(20):
        chosen = fair_sample(cands, 8, 4, random.Random(seed))
        assert Counter(c.owner for c in chosen) == {"flood": 2, "a": 2, "b": 2, "c": 2}
    # With room for 3 of 4 identities, nobody gets a second group.
    chosen = fair_sample(cands, 3, 4, random.Random(1))
    assert len({c.owner for c in chosen}) == 3


def test_fresh_identities_share_one_seat_beside_peers_with_a_record() -> None:
    rep = Reputation()
    for _ in range(10):
        rep.record("honest", None)
    cands = [Cand("honest", i) for i in range(4)] + [Cand(f"sybil{k}", i) for k in range(15) for i in range(16)]
    honest_taken = sybil_taken = 0
    for seed in range(200):
        chosen = fair_sample(cands, 4, 4, random.Random(seed), rep.weight, rep.standing)
        honest_taken += sum(c.owner == "honest" for c in chosen)
        sybil_taken += sum(c.owner != "honest" for c in chosen)
    # Equal weights would give the honest peer 1/16 of first-round slots. The 15 fresh identities share
    # one seat of quota max(1, round(4 x 1/4)) = 1: the honest peer gets the other 3 slots, every time.
    assert honest_taken == 3 * 200 and sybil_taken == 200
    # Slots nobody with a record wants go to fresh identities one by one, each within its quota of one.
    chosen = fair_sample(cands, 64, 4, random.Random(0), rep.weight, rep.standing)
    per = Counter(c.owner for c in chosen)
    assert per["honest"] == 4 and len(per) == 16 and max(v for k, v in per.items() if k != "honest") == 1


def test_the_lottery_lets_newcomers_in_and_their_weight_recovers() -> None:
    """The soak's finding: a strict order by weight put a sender not taken early behind 4 trusted
    ones for good. Under the lottery the newcomer seat wins a slot now and then, the newcomer earns
    a record, and ends with a seat and a share like the others'."""
    rep = Reputation()
    trusted = ["t1", "t2", "t3", "t4"]
    for p in trusted:
        for _ in range(10):
            rep.record(p, None)
    cands = [Cand(p, i) for p in [*trusted, "new"] for i in range(2)]
    strict = sum(c.owner == "new" for seed in range(200)  # the old rule: higher weight first
                 for c in sorted(cands, key=lambda c: (-round(rep.weight(c.owner), 1), c.owner))[:4])
    assert strict == 0
    taken: list[Counter] = []
    for gather in range(60):
        rep.tick()
        chosen = fair_sample(cands, 4, 1, random.Random(gather), rep.weight, rep.standing)
        for c in chosen:
            rep.record(c.owner, None)  # every group fetched is taken
        taken.append(Counter(c.owner for c in chosen))
    first = next(g for g, t in enumerate(taken) if t["new"])
    late = sum(t["new"] for t in taken[30:]) / 30
    assert first < 10 and rep.standing("new") == "own" and late >= 0.5, (first, late, rep.weight("new"))


def test_senders_whose_groups_are_not_taken_share_one_probe_slot() -> None:
    rep = Reputation()
    for _ in range(10):
        rep.record("honest", None)
    idle = [f"idle{k}" for k in range(6)]
    cands = [Cand("honest", 0)] + [Cand(p, i) for p in idle for i in range(8)]
    held, probed_held, all_probed = [], [], None
    for gather in range(30):
        rep.tick()
        probed = {p for p in idle if rep.standing(p) == "probe"}
        if all_probed is None and len(probed) == len(idle):
            all_probed = gather
        chosen = fair_sample(cands, 4, 1, random.Random(gather), rep.weight, rep.standing)
        for c in chosen:
            if c.owner == "honest":
                rep.record("honest", None)
            else:
                rep.record_miss(c.owner, "tokenizer_mismatch")  # fetched, and dropped for an honest reason
        held.append(sum(c.owner != "honest" for c in chosen))
        probed_held.append(sum(c.owner in probed for c in chosen))
    # Three of four slots while nothing is known of them; probed ones one slot in all, in every
    # gather; once each has been fetched once (by the third gather here), one slot in all.
    assert held[0] == 3 and max(probed_held) == 1 and all_probed is not None and all_probed <= 3, held
    assert max(held[all_probed:]) <= 1 and sum(held[all_probed:]) <= 30 - all_probed, held
    assert all(rep.standing(p) == "probe" for p in idle) and not any(rep.excluded(p) for p in idle)
    rep.record("idle0", None)  # taken again (a probe slot): its misses fade, its takes count
    for _ in range(3):
        rep.tick()
        rep.record("idle0", None)
    assert rep.standing("idle0") != "probe"
    # this node's own budgets are no misses
    rep.record_miss("q", OVER_TOKEN_BUDGET)
    assert rep.standing("q") == "newcomer"


def test_the_byte_budget_bounds_what_one_sender_makes_a_gather_download() -> None:
    @dataclass
    class Sized:
        owner: str
        n: int
        size: int

    cands = [Sized("big", i, 3) for i in range(8)] + [Sized("small", i, 1) for i in range(8)]
    chosen = fair_sample(cands, 16, 8, random.Random(0), cost=lambda c: c.size, max_cost_per_peer=7)
    per = Counter(c.owner for c in chosen)
    assert per == {"big": 2, "small": 7}  # 2 x 3 <= 7 < 3 x 3; 7 x 1


def test_reputation_lowers_share_excludes_and_forgives() -> None:
    rep = Reputation()
    adm = Admission(reputation=rep)
    assert adm.peer_reason("p") is None
    for _ in range(3):
        rep.record("p", "logprob_positive")
    assert rep.weight("p") < 0.1 and adm.peer_reason("p") is None  # lowered, not yet excluded
    rep.record("p", "duplicate")
    assert adm.peer_reason("p") == EXCLUDED
    # Network weather counts for little, this node's own budgets not at all.
    rep.record("q", "fetch_timeout")
    rep.record("q", OVER_TOKEN_BUDGET)
    assert rep.faults["q"] == pytest.approx(0.25)
    for _ in range(30):
        rep.tick()
    assert adm.peer_reason("p") is None  # faults decay


def test_allow_list_closes_the_swarm() -> None:
    adm = Admission(allowed_peers=["a", "b"])
    assert adm.peer_reason("a") is None and adm.peer_reason("mallory") == NOT_ALLOWED
    assert Admission().peer_reason("mallory") is None


def test_signed_allow_list_file(tmp_path) -> None:
    from swarm_node.swarm.allowlist import AllowListError, load_allow_list, write_allow_list
    from swarm_node.swarm.identity import load_or_create_key, public_key_text

    operator = load_or_create_key(tmp_path / "op.key")
    other = load_or_create_key(tmp_path / "other.key")
    path = tmp_path / "allow.json"
    write_allow_list(path, SALT, ["QmB", "QmA", "QmA"], operator)
    assert load_allow_list(path, SALT, public_key_text(operator)) == ["QmA", "QmB"]
    with pytest.raises(AllowListError, match="not signed by"):
        load_allow_list(path, SALT, public_key_text(other))
    with pytest.raises(AllowListError, match="for swarm"):
        load_allow_list(path, "another-swarm", public_key_text(operator))
    doc = json.loads(path.read_text())
    doc["peers"].append("QmMallory")
    path.write_text(json.dumps(doc))
    with pytest.raises(AllowListError, match="not signed by"):
        load_allow_list(path, SALT, public_key_text(operator))
    with pytest.raises(AllowListError, match="needs swarm.prompt_set_owner"):
        load_allow_list(path, SALT, None)


def test_prompt_must_be_one_assigned_to_sender_in_its_window() -> None:
    adm = Admission(prompts=PROMPTS)
    mine = _assigned("peerA")
    not_mine = next(i for i in range(50) if i not in mine)
    assert adm.group_reason(_group("peerA", mine[0], version=3), 0) is None
    assert adm.group_reason(_group("peerA", not_mine, version=3, seed=1), 0) == WRONG_PROMPT
    assert adm.entry_reason("peerA", not_mine, 100.0) == WRONG_PROMPT
    assert adm.entry_reason("peerA", mine[1], 100.0) is None
    # Another sender (a cherry-picker claiming peerA's easy prompt) is not assigned it, in general.
    others = [p for p in (f"peer{k}" for k in range(20)) if mine[0] not in _assigned(p)]
    assert adm.group_reason(_group(others[0], mine[0], version=3, seed=2), 0) == WRONG_PROMPT
    # Nor is peerA in a window whose assignment does not hold it.
    later = next(t for t in range(130, 3000, 30) if not_mine not in _assigned("peerA", t))
    assert adm.entry_reason("peerA", not_mine, float(later)) == WRONG_PROMPT


def test_a_window_admits_each_assigned_prompt_once_per_sender() -> None:
    adm = Admission(prompts=PROMPTS)
    mine = _assigned("peerA")
    assert len(set(mine)) == 8
    for k, index in enumerate(mine):
        assert adm.group_reason(_group("peerA", index, version=k, seed=k), 0) is None
    # The n x S = 8 groups of the window are taken: the same prompt again, at any version, is refused.
    assert adm.group_reason(_group("peerA", mine[0], version=99, seed=99), 0) == SLOT_OVERUSED
    assert adm.entry_reason("peerA", mine[0], 100.0) == SLOT_OVERUSED
    # The next window brings the next 8.
    assert adm.group_reason(_group("peerA", _assigned("peerA", 130.0)[0], seed=100, created_at=130.0), 0) is None


def test_candidates_listed_in_one_gather_hold_their_quota() -> None:
    adm = Admission(prompts=PROMPTS)
    adm.begin_gather()
    index = _assigned("peerA")[0]
    assert adm.entry_reason("peerA", index, 100.0) is None
    assert adm.entry_reason("peerA", index, 110.0) == SLOT_OVERUSED  # listed twice in its window
    adm.begin_gather()  # not taken: listed again next time
    assert adm.entry_reason("peerA", index, 100.0) is None


def test_horizontal_prompts_follow_the_window() -> None:
    prompts = replace(PROMPTS, horizontal=True, window_seconds=10.0)
    window_prompts = select_prompts("horizontal", 7, 2, 50, salt=SALT)
    assert prompts.quota("anyone", window_prompts[0], 75.0) == (7, 4)  # window 7, S times per sender
    for t in (85.0, 125.0):  # created_at is the step's start: only its own window's prompts
        w = keys.window_of(t, 10.0)
        assert prompts.assigned("anyone", window_prompts[0], t) == (
            window_prompts[0] in select_prompts("horizontal", w, 2, 50, salt=SALT))


def test_sender_keeps_its_declared_group_size() -> None:
    adm = Admission(prompts=PROMPTS)
    a = _assigned("peerA")
    assert adm.group_reason(_group("peerA", a[0], version=0, g=4), 0) is None
    assert adm.group_reason(_group("peerA", a[2], version=1, g=2, seed=3), 0) == GROUP_SIZE_CHANGED
    assert adm.group_reason(_group("peerA", a[3], version=1, g=4, seed=4), 0) is None
    # A version-4 entry declaring another G is refused before its group is fetched.
    assert adm.entry_reason("peerA", a[4], 100.0, group_size=2) == GROUP_SIZE_CHANGED
    assert adm.entry_reason("peerA", a[4], 100.0, group_size=4) is None


def test_replay_under_another_identity_is_a_duplicate() -> None:
    adm = Admission()
    original = _group("honest", 5, seed=7, tokens=MIN_FINGERPRINT_TOKENS)
    assert adm.group_reason(original, 0) is None
    replay = replace(original, sender="mallory")
    assert adm.group_reason(replay, 0) == DUPLICATE
    # Half replayed, half fresh is still a replay; one shared completion is not.
    fresh = _group("mallory", 5, seed=8, tokens=MIN_FINGERPRINT_TOKENS)
    half = replace(fresh, completions=original.completions[:2] + fresh.completions[2:])
    assert adm.group_reason(half, 0) == DUPLICATE
    one = replace(fresh, completions=original.completions[:1] + fresh.completions[1:])
    assert adm.group_reason(one, 0) is None
    # Reordering or claiming another prompt does not hide a replay either.
    assert adm.group_reason(replace(original, sender="eve", completions=original.completions[::-1]), 0) == DUPLICATE
    assert adm.group_reason(replace(original, sender="eve", prompt=replace(original.prompt, index=9)), 0) == DUPLICATE


def test_replay_of_this_nodes_own_groups_is_a_duplicate() -> None:
    adm = Admission()
    mine = _group("me", 3, seed=11, tokens=MIN_FINGERPRINT_TOKENS)
    adm.remember_own([mine], 0)
    assert adm.group_reason(replace(mine, sender="mallory"), 0) == DUPLICATE


def test_the_same_short_answer_from_honest_peers_is_not_a_replay() -> None:
    adm = Admission()
    short = MIN_FINGERPRINT_TOKENS - 1
    mine = _group("me", 3, seed=11, tokens=short)
    adm.remember_own([mine], 0)
    assert adm.group_reason(replace(mine, sender="honest-twin"), 0) is None
    assert adm.group_reason(replace(mine, sender="honest-other", prompt=replace(mine.prompt, index=4)), 0) is None


def test_a_likely_completion_drawn_again_by_an_honest_peer_is_not_a_replay() -> None:
    """Two nodes warmed from one checkpoint draw the same long answer when their models are peaky: a
    copy counts only if its first copy was improbable (MIN_REPLAY_NATS), whatever the replay declares."""
    adm = Admission()
    peaky = _group("me", 3, seed=11, tokens=MIN_FINGERPRINT_TOKENS)
    peaky = replace(peaky, completions=tuple(replace(c, logprobs=np.full(len(c.token_ids), -0.1, np.float32))
                                             for c in peaky.completions))  # 1.6 nats each: likely
    adm.remember_own([peaky], 0)
    assert adm.group_reason(replace(peaky, sender="honest-twin"), 0) is None
    rare = _group("me", 4, seed=12, tokens=MIN_FINGERPRINT_TOKENS)  # 16 nats each: improbable
    adm.remember_own([rare], 0)
    forged = tuple(replace(c, logprobs=np.full(len(c.token_ids), -0.01, np.float32)) for c in rare.completions)
    assert adm.group_reason(replace(rare, sender="mallory", completions=forged), 0) == DUPLICATE


def test_token_budget_per_gather() -> None:
    adm = Admission(max_tokens_per_gather=30)
    adm.begin_gather()
    assert adm.group_reason(_group("a", 1, tokens=5, seed=1), 0) is None    # 20 tokens
    assert adm.group_reason(_group("b", 2, tokens=5, seed=2), 0) == OVER_TOKEN_BUDGET
    assert adm.group_reason(_group("c", 3, tokens=2, seed=3), 0) is None    # 8 more: 28
    adm.begin_gather()
    assert adm.group_reason(_group("b", 2, tokens=5, seed=2), 0) is None


def test_allow_list_command_writes_a_file_nodes_accept(tmp_path) -> None:
    from typer.testing import CliRunner

    from swarm_node.ops.cli import app
    from swarm_node.config import NodeConfig
    from swarm_node.node.assemble import build_admission
    from swarm_node.swarm.identity import load_or_create_key, public_key_text
    from swarm_node.tasks.base import PromptSet

    key_file, out = tmp_path / "op.key", tmp_path / "allow.json"
    result = CliRunner().invoke(app, ["allow-list", "--peer", "QmA", "--peer", "QmB", "--swarm-id", SALT,
                                      "--key-file", str(key_file), "--out", str(out)])
    assert result.exit_code == 0, result.output
    cfg = NodeConfig.load(None, [f'swarm.swarm_id="{SALT}"', f'swarm.allowed_peers_file="{out}"',
                                 f'swarm.prompt_set_owner="{public_key_text(load_or_create_key(key_file))}"'])
    adm = build_admission(cfg, PromptSet(id="ps-1", answer_kind="number", problems=()))
    assert adm.peer_reason("QmA") is None and adm.peer_reason("QmC") == NOT_ALLOWED


def test_degraded_exchange_is_logged_at_most_once_a_minute(caplog) -> None:
    from swarm_node.swarm.admission import DegradedExchangeLog

    log = DegradedExchangeLog(interval_s=60.0)
    log.check(taken=4, drops=Counter({"duplicate": 3}))          # a normal gather: silent
    assert log.warnings == 0
    with caplog.at_level("WARNING"):
        log.check(taken=0, drops=Counter({"wrong_prompt": 40, "missing": 9}))
        log.check(taken=0, drops=Counter({"wrong_prompt": 40}))  # within the minute: not again
    assert log.warnings == 1
    assert "peer exchange degraded: took 0 groups, dropped 49 (wrong_prompt 40, missing 9)" in caplog.text
