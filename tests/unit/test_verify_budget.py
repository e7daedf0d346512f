"""The verifier budget: per gather and per peer, a group dropped whole on a verifier timeout, peers'
rewards computed off the step thread, and a stall attack through the node loop."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from swarm_node.policy.types import GeneratedCompletion
from swarm_node.peers.rejects import RejectList
from swarm_node.tasks import Problem
from swarm_node.tasks.bounded import BoundedRunner
from swarm_node.tasks.rewards import CorrectnessReward, Score
from swarm_node.tasks.verify import VERIFIER_TIMEOUT, VERIFY_BUDGET, PeerVerifier

PROBLEM = Problem(index=0, question="q", answer="\\frac{1}{2}")


class FakeReward:
    """`score` that takes `cost[text]` seconds of a fake clock and times out on "slow" texts."""

    def __init__(self, clock: list[float], timeout_s: float = 5.0) -> None:
        self.clock = clock
        self.timeout_s = timeout_s
        self.bounds: list[float] = []

    def score(self, text: str, problem: Problem, *, peer: bool = False, timeout_s: float | None = None) -> Score:
        assert peer
        self.bounds.append(timeout_s)
        if text == "slow":
            self.clock[0] += timeout_s
            return Score(False, True, "boxed", "timeout", 0.0)
        self.clock[0] += 0.1
        return Score(text == "right", True, "boxed", "numeric", float(text == "right"))


def verifier(step: float = 1.0, peer: float = 0.5, timeout: float = 5.0) -> tuple[PeerVerifier, FakeReward]:
    clock = [0.0]
    reward = FakeReward(clock, timeout)
    return PeerVerifier(reward, step, peer, clock=lambda: clock[0]), reward


def test_rewards_within_budget() -> None:
    v, _ = verifier()
    verdict = v.group_rewards(["right", "wrong", "right"], PROBLEM, "p1")
    assert verdict.rewards == [1.0, 0.0, 1.0] and verdict.reason is None
    assert verdict.seconds == pytest.approx(0.3) and v.spent == pytest.approx(0.3)


def test_per_peer_budget_drops_the_whole_group_and_leaves_others_alone() -> None:
    v, _ = verifier(step=10.0, peer=0.5)
    assert v.group_rewards(["right"] * 4, PROBLEM, "greedy").rewards is not None  # 0.4 s
    late = v.group_rewards(["right"] * 4, PROBLEM, "greedy")  # runs out after one more answer
    assert late.rewards is None and late.reason == VERIFY_BUDGET and not late.blamed
    assert v.group_rewards(["right"] * 4, PROBLEM, "other").rewards == [1.0] * 4  # another peer's share


def test_step_budget_caps_all_peers() -> None:
    v, _ = verifier(step=0.55, peer=10.0, timeout=0.2)
    assert v.group_rewards(["right"] * 5, PROBLEM, "a").rewards is not None  # 0.5 s
    assert v.group_rewards(["right"] * 2, PROBLEM, "b").reason == VERIFY_BUDGET
    assert v.group_rewards(["right"], PROBLEM, "c").reason == VERIFY_BUDGET  # nothing left at all
    assert v.spent <= 0.55 + 0.1 + 1e-9


def test_a_timeout_drops_the_group_whole_and_is_blamed_at_full_bound() -> None:
    v, reward = verifier(step=10.0, peer=2.0, timeout=1.0)
    verdict = v.group_rewards(["right", "slow", "right"], PROBLEM, "evil")
    assert verdict.rewards is None and verdict.reason == VERIFIER_TIMEOUT and verdict.blamed
    assert reward.bounds == [1.0, 1.0]  # the verifier's own bound; the third answer is never scored
    # Only 0.9 s of the peer's budget is left: a timeout now is the budget's doing, not blamed.
    squeezed = v.group_rewards(["slow"], PROBLEM, "evil")
    assert squeezed.reason == VERIFY_BUDGET and not squeezed.blamed
    assert reward.bounds[-1] == pytest.approx(0.9)


def test_plain_reward_functions_are_accounted() -> None:
    v = PeerVerifier(lambda text, problem: 1.0, 1.0, 1.0)
    assert v.group_rewards(["a", "b"], PROBLEM, "p").rewards == [1.0, 1.0]
    with pytest.raises(ValueError):
        PeerVerifier(lambda text, problem: 1.0, 0.0, 1.0)


def _never_answers(gold: str, prediction: str) -> bool:
    """A verifier call that does not return (runs in the worker process)."""
    time.sleep(60)
    return True


def test_real_verifier_timeout_is_bounded_by_the_peer_budget() -> None:
    reward = CorrectnessReward("math", timeout_s=5.0, verify_fn=_never_answers, runner=BoundedRunner(10.0))
    try:
        reward.runner.start()
        v = PeerVerifier(reward, step_budget_s=3.0, peer_budget_s=0.5)
        start = time.perf_counter()
        verdict = v.group_rewards(["\\boxed{0.5}", "\\boxed{x}"], PROBLEM, "evil")
        took = time.perf_counter() - start
        assert verdict.reason == VERIFIER_TIMEOUT and verdict.blamed  # full bound: min(5 s, 0.5 s)
        assert took < 0.5 + 2.0
        assert v.group_rewards(["\\boxed{1}"], PROBLEM, "evil").reason == VERIFY_BUDGET  # its share is spent
    finally:
        reward.close()


def _agrees(gold: str, prediction: str) -> bool:
    return True


def test_the_peer_workers_startup_is_not_charged_to_the_peer() -> None:
    """The peers' worker takes 1.5 s to come up (math_verify's import on a loaded machine did) against
    a peer budget of 1 s: the verifier waits for it before the peer's clock starts, so the peer's
    group is scored, not dropped for a budget its own answers never used."""
    reward = CorrectnessReward("math", timeout_s=5.0, verify_fn=_agrees, runner=BoundedRunner(10.0))
    reward._peer_runner = BoundedRunner(5.0, warmup=(time.sleep, (1.5,)))
    try:
        reward.start_peer_worker()  # launched, not ready: what a node does as its first gather begins
        v = PeerVerifier(reward, step_budget_s=4.0, peer_budget_s=1.0)
        verdict = v.group_rewards(["\\boxed{0.5}", "\\boxed{0.5}"], PROBLEM, "p")
        assert verdict.reason is None and verdict.rewards == [1.0, 1.0]
        assert v.spent_by_peer["p"] < 1.0
    finally:
        reward.close()


# ---- through the node loop --------------------------------------------------------------------------

def _publish_texts(node, text: str) -> None:
    """Make `node` publish groups whose every completion is `text` (a hostile peer's answers)."""
    tok = node.parts.policy.tokenizer
    ids = np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)

    def hostile(prompt_ids, n):
        return [[GeneratedCompletion(ids, np.full(len(ids), -1.0, dtype=np.float32), "stop") for _ in range(n)]
                for _ in prompt_ids]

    node.parts.generator.generate = hostile


def _stall_on_pi(gold: str, prediction: str) -> bool:
    """Stands in for an answer that passes the pre-screen but runs sympy for ever."""
    if "\\pi" in prediction:
        time.sleep(60)
    return False


def test_verifier_stall_attack_costs_a_bounded_time_off_the_step_thread(tmp_path: Path) -> None:
    from swarm_node.swarm.memory import MemorySwarm
    from tests.unit.test_node_loop import make_node

    swarm = MemorySwarm()
    evil = make_node(tmp_path, swarm, "evil", extra=["generation.group_size=8", "generation.max_new_tokens=24"])
    _publish_texts(evil, "\\boxed{\\pi^{2}}")
    honest = make_node(tmp_path, swarm, "honest", extra=["generation.max_new_tokens=24", "task.peer_reward_budget_s=1.0",
                                                           "task.peer_reward_budget_per_peer_s=0.4",
                                                               "swarm.max_peer_group_size=8",  # the evil G
                                                               # its forged logprobs would fail the spot
                                                               # check first (both hold the same model)
                                                               "swarm.spot_check.enabled=false"])
    honest.parts.reward_fn = CorrectnessReward("number", timeout_s=5.0, verify_fn=_stall_on_pi,
                                               runner=BoundedRunner(10.0))
    honest.parts.close_hooks.append(honest.parts.reward_fn.close)
    honest.parts.reward_fn.runner.start()  # warm, as after the first step (startup is not verification)
    threads: set[str] = set()
    score = honest.parts.reward_fn.score

    def spy(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return score(*args, **kwargs)

    honest.parts.reward_fn.score = spy
    # The budget in isolation: a reputation that lets a fresh peer's every group be fetched (the
    # default would fetch one group of a fresh identity per step, and fewer after its first fault).
    from swarm_node.swarm.admission import Reputation

    honest.parts.exchange.admission.reputation = Reputation(penalty=0.0, exclude_faults=float("inf"), trusted_after=0.0)
    evil.run_step()
    start = time.perf_counter()
    m = honest.run_step()
    took = time.perf_counter() - start
    assert m["peer_groups"] == 0 and m["dropped_verifier_timeout"] == 1  # the first group, then the budget
    assert m["dropped_verify_budget"] >= 1
    assert m["peer_reward_seconds"] <= 0.4 + 0.5 and took < 10.0
    assert all(math.isfinite(x) for x in m.values())
    assert any(t.startswith("gather") for t in threads)  # peers' rewards off the step thread
    # The timed-out record is refused for good: a restarted node does not spend the time again.
    assert len(RejectList(tmp_path / "honest" / "rejected_records.json")) == 1
    honest.parts.reward_fn.runner.close()
