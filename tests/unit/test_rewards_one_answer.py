"""Rewards that mean one answer: exactly one final answer, single-valued, pre-screened before the
verifier; the same rules for every task (with each task's own marker) and for own and peer samples."""

from __future__ import annotations

import time

import pytest

from swarm_node.config import TaskConfig
from swarm_node.tasks import Problem, make_reward_fn
from swarm_node.tasks.answers import prescreen, single_value
from swarm_node.tasks.bounded import BoundedRunner
from swarm_node.tasks.rewards import CorrectnessReward

W, G = "41", "42"  # a wrong and the right answer


def problem(gold: str = G) -> Problem:
    return Problem(index=0, question="q", answer=gold)


# The strings, for every task: hedged, multi-valued, both sides of an equation, no box.
HOSTILE = [
    f"\\boxed{{{G} \\text{{(or {W})}}}}",
    f"\\boxed{{{W} \\text{{(or {G})}}}}",
    f"\\boxed{{{W}}} \\boxed{{{G}}}",
    f"\\boxed{{{G}}} \\boxed{{{W}}}",
    f"\\boxed{{{W} = {G}}}",
    f"\\boxed{{{G} = {W}}}",
    f"The answer is {G}.",
    f"\\boxed{{{G}}} \\boxed{{{G}}}",  # the same answer twice is still two final answers
    f"\\boxed{{{G} or {W}}}",
    f"\\boxed{{{W} \\text{{ and }} {G}}}",
    f"\\boxed{{{G} \\pm 1}}",
    f"\\boxed{{\\approx {G}}}",
    f"\\boxed{{x = {W} = {G}}}",
]


@pytest.mark.parametrize("task", ["arithmetic", "gsm8k", "math500"])
@pytest.mark.parametrize("text", HOSTILE)
def test_hedged_or_multi_valued_answers_score_zero(task: str, text: str, runner: BoundedRunner) -> None:
    reward = make_reward_fn(TaskConfig(name=task, source="x.jsonl"), "math" if task == "math500" else "number")
    reward.runner.close()
    reward.runner = reward._peer_runner = runner  # share the module's worker
    for peer in (False, True):
        assert reward.score(text, problem(), peer=peer).reward == 0.0, (task, text, peer)


@pytest.mark.parametrize("task", ["arithmetic", "gsm8k", "math500"])
@pytest.mark.parametrize("text", [f"\\boxed{{{G}}}", f"so \\boxed{{x = {G}}}", f"\\boxed{{{G} \\text{{ apples}}}}",
                                  f"\\boxed{{\\${G}.00}}"])
def test_one_plain_answer_scores_one(task: str, text: str, runner: BoundedRunner) -> None:
    reward = make_reward_fn(TaskConfig(name=task, source="x.jsonl"), "math" if task == "math500" else "number")
    reward.runner.close()
    reward.runner = reward._peer_runner = runner
    assert reward.score(text, problem()).reward == 1.0
    assert reward.score(text, problem(), peer=True).reward == 1.0


def test_task_markers() -> None:
    gsm8k = make_reward_fn(TaskConfig(name="gsm8k", source="x.jsonl"), "number")
    arithmetic = make_reward_fn(TaskConfig(name="arithmetic"), "number")
    assert gsm8k(f"work...\n#### {G}", problem()) == 1.0  # GSM8K's own marker is a final answer
    assert gsm8k(f"#### {W}\n#### {G}", problem()) == 0.0  # two markers: two answers
    assert gsm8k(f"\\boxed{{{G}}}\n#### {G}", problem()) == 0.0  # a box and the marker: two answers
    assert arithmetic(f"\\boxed{{{G}}}\n#### {G}", problem()) == 1.0  # not arithmetic's marker: one answer
    assert arithmetic(f"work...\n#### {G}", problem()) == 0.0  # arithmetic requires a box
    assert gsm8k.counters()["no_answer"] == 2 and arithmetic.counters()["no_answer"] == 1


def test_an_answer_the_gold_itself_writes_is_allowed() -> None:
    assert single_value("3 \\pm \\sqrt{2}", "3 \\pm \\sqrt{2}") == "3 \\pm \\sqrt{2}"
    assert single_value("y = 2x + 1", "y = 2x+1") == "y = 2x + 1"
    assert single_value("\\text{(C)}", "\\text{(C)}") == "\\text{(C)}"
    assert single_value("\\theta = \\frac{\\pi}{2}", "\\frac{\\pi}{2}") == "\\frac{\\pi}{2}"
    assert single_value("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)") is not None  # \\left is not \\le
    assert single_value("5 = 5", "5") is None


@pytest.mark.parametrize(("answer", "gold", "reason"), [
    ("99!!", "3", "factorial"),
    ("9^{9^9}", "3", "tower"),
    ("9^{9^{9^{9}}}", "3", "tower"),
    ("9^9^9", "3", "tower"),
    ("2^{123456}", "3", "big_exponent"),
    ("1" * 45, "3", "big_literal"),
    ("\\sum_{k=1}^{10^9} k", "3", "sum"),
    ("\\int_0^1 x dx", "1/2", "integral"),
    ("1+" * 40 + "1", "3", "too_long"),
    ("1,\\!000", "1000", None),  # \\! is a thin space
    ("(-\\infty, 3)", "(-\\infty, 3]", None),  # \\infty is not \\int
    ("2^{10}", "1024", None),
    ("5!", "120", "factorial"),
    ("5!", "5!", None),  # the gold has it: allowed
])
def test_prescreen(answer: str, gold: str, reason: str | None) -> None:
    assert prescreen(answer, gold) == reason


def test_prescreened_answers_never_reach_the_verifier(runner: BoundedRunner) -> None:
    reward = CorrectnessReward("math", timeout_s=5.0, runner=runner)
    calls_before = runner.calls
    start = time.perf_counter()
    for text in ("\\boxed{99!!}", "\\boxed{9^{9^9}}", "\\boxed{9^{9^{9^{9}}}}"):
        assert reward.score(text, problem("3"), peer=True).method == "prescreened"
    assert time.perf_counter() - start < 0.5 and runner.calls == calls_before
    assert reward.counters()["prescreened"] == 3


def test_peer_answers_use_their_own_worker() -> None:
    reward = CorrectnessReward("math", timeout_s=5.0)
    try:
        reward.start_peer_worker()  # launched in the background, not waited for
        reward.start_peer_worker()  # idempotent
        assert reward._peer_runner is not None and reward._peer_runner.starts == 1
        assert reward.score("\\boxed{\\frac{2}{4}}", problem("\\frac{1}{2}"), peer=True).reward == 1.0
        assert reward._peer_runner is not reward.runner and reward._peer_runner.starts == 1
        assert reward.runner.starts == 0  # own worker untouched by peers' answers
    finally:
        reward.close()
