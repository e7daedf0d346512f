"""Bounded reward computation: timeouts, errors, crashes, and calls from worker threads."""

from __future__ import annotations

import os
import time

from swarm_node.tasks import Problem
from swarm_node.tasks.bounded import BoundedRunner
from swarm_node.tasks.rewards import CorrectnessReward


def _slow_verify(gold: str, prediction: str) -> bool:
    """A verifier that never answers in time (runs in the worker process)."""
    time.sleep(60)
    return True


def _timed(fn, *args):  # noqa: ANN001, ANN202
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def test_runner_timeout_error_crash_and_restart() -> None:
    runner = BoundedRunner(0.5)
    try:
        runner.start()
        assert runner.call(abs, -3).value == 3
        outcome, seconds = _timed(runner.call, time.sleep, 60)
        assert outcome.status == "timeout" and seconds < 0.5 + 3.0
        assert runner.call(abs, -4).value == 4  # a fresh worker (launched at the timeout) answers
        assert runner.call(time.sleep, 0.01, timeout_s=5.0).status == "ok"  # a per-call bound
        assert runner.starts == 2 and runner.timeouts == 1
        err = runner.call(int, "not a number")
        assert err.status == "error" and "ValueError" in err.detail
        assert runner.starts == 2  # an exception does not cost the worker
        crash = runner.call(os._exit, 3)
        assert crash.status == "crashed"
        assert runner.call(abs, -5).value == 5 and runner.starts == 3
        assert runner.counters() == {"calls": 7, "timeouts": 1, "errors": 1, "crashes": 1, "starts": 3}
    finally:
        runner.close()


def test_reward_with_slow_verifier_returns_zero_within_bound() -> None:
    reward = CorrectnessReward("math", timeout_s=0.5, verify_fn=_slow_verify, runner=BoundedRunner(10.0))
    try:
        reward.runner.start()
        problem = Problem(0, "q", "\\frac{1}{2}")
        value, seconds = _timed(reward, "\\boxed{0.5}", problem)
        assert value == 0.0 and seconds < 0.5 + 3.0  # generous: CI machines are shared
        assert reward("\\boxed{0.5}", Problem(0, "q", "0.5")) == 1.0  # numeric fast path needs no verifier
        assert reward.counters()["timeouts"] == 1
    finally:
        reward.close()
