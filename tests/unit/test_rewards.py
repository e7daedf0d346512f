"""Rewards: answer extraction, numeric and math-verify comparison, the format bonus, bad inputs."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest

from swarm_node.config import TaskConfig
from swarm_node.tasks import Problem, make_reward_fn
from swarm_node.tasks.bounded import BoundedRunner
from swarm_node.tasks.rewards import (
    CorrectnessReward,
    extract_answer,
    is_well_formatted,
    last_boxed,
    parse_number,
)


def gsm(answer: str) -> Problem:
    return Problem(index=0, question="q", answer=answer)


@pytest.fixture(scope="module")
def number_reward(runner: BoundedRunner) -> CorrectnessReward:
    return CorrectnessReward("number", runner=runner)


@pytest.fixture(scope="module")
def math_reward(runner: BoundedRunner) -> CorrectnessReward:
    return CorrectnessReward("math", runner=runner)


def test_last_boxed_and_format() -> None:
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{2}{3}} c") == "\\frac{2}{3}"
    assert last_boxed("\\boxed{ {nested} }") == " {nested} "
    assert last_boxed("\\boxed{1} then \\boxed{2") == "1"  # unclosed last box: the last well-formed one
    assert last_boxed("\\boxed{\\{1\\}}") == "\\{1\\}"  # escaped braces do not close the box
    assert last_boxed("no box") is None
    assert is_well_formatted("so \\boxed{4}.")
    assert not is_well_formatted("\\boxed{4} \\boxed{4}")
    assert not is_well_formatted("\\boxed{}")
    assert not is_well_formatted("\\boxed{4} and \\boxed{")
    assert not is_well_formatted("4")


def test_extract_answer_sources() -> None:
    assert extract_answer("x \\boxed{7} y 9", "number") == ("7", "boxed")
    assert extract_answer("steps 3 4\n#### 1,234 done 5", "number", ("####",)) == ("1,234", "hashes")
    assert extract_answer("steps 3 4\n#### 1,234 done 5", "number") == (None, "none")  # not this task's marker
    assert extract_answer("it is 12, or maybe 13.5", "number") == (None, "none")  # no box: no answer
    assert extract_answer("no digits", "number") == (None, "none")
    assert extract_answer("the answer is $x^2$", "math") == (None, "none")
    assert extract_answer("   ", "math") == (None, "none")


@pytest.mark.parametrize(
    ("text", "value"),
    [("72", 72), ("1,234", 1234), ("$1,234.00", 1234), ("\\$5", 5), ("72.0", 72), ("-3", -3), ("1{,}000", 1000),
     ("5 \\text{ apples}", 5), ("72 dollars", 72), ("50\\%", 50), ("0.5", Fraction(1, 2)), (".5", Fraction(1, 2)),
     ("\u22124", -4), ("{12}", 12), ("12.", 12)],
)
def test_parse_number_accepts_decorated_numbers(text: str, value: Fraction) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["\\frac{1}{2}", "x=5", "1.2.3", "seventy", "", "3+4", "9" * 200, "(1,2)"])
def test_parse_number_rejects_non_numbers(text: str) -> None:
    assert parse_number(text) is None


@pytest.mark.parametrize(
    ("completion", "gold", "correct"),
    [
        ("So she sold 48+24=72 clips. \\boxed{72}", "72", True),
        ("\\boxed{72.0}", "72", True),
        ("\\boxed{\\$1,200}", "1200", True),
        ("\\boxed{71}", "72", False),
        ("\\boxed{72} wait, actually \\boxed{73}", "72", False),  # two answers: none counts
        ("\\boxed{73} no: \\boxed{72}", "72", False),
        ("The answer is 72.", "72", False),  # no box: no answer
        ("#### 72\nI am not sure, 5", "72", False),  # #### is GSM8K's marker, not this reward's
        ("72 apples, minus 1 is 71", "72", False),
        ("\\boxed{-5}", "-5", True),
        ("\\boxed{5}", "-5", False),
        ("", "72", False),
        ("}}}{{{\\boxed{\\boxed{", "72", False),
        ("\\boxed{\\frac{144}{2}}", "72", True),  # not a plain number: math-verify decides
        ("\\boxed{seventy-two}", "72", False),
    ],
)
def test_number_rewards(number_reward: CorrectnessReward, completion: str, gold: str, correct: bool) -> None:
    assert number_reward(completion, gsm(gold)) == (1.0 if correct else 0.0)


@pytest.mark.parametrize(
    ("completion", "gold", "correct"),
    [
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("\\boxed{1/2}", "\\frac{1}{2}", True),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
        ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True),
        ("\\boxed{\\sqrt{2}}", "2\\sqrt{2}", False),
        ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("\\boxed{(3, \\pi)}", "\\left( 3, \\frac{\\pi}{2} \\right)", False),
        ("so the answer is $\\frac{1}{2}$", "\\frac{1}{2}", False),  # unboxed LaTeX: no answer
        ("so the answer is 1/2", "\\frac{1}{2}", False),  # unboxed plain text: no answer
        ("\\boxed{10}", "10", True),  # numeric fast path
        ("\\boxed{11}", "10", False),
        ("", "10", False),
        ("\\boxed{}", "10", False),
        ("%%%% garbage \\boxed{\\frac{", "\\frac{1}{2}", False),
    ],
)
def test_math_rewards(math_reward: CorrectnessReward, completion: str, gold: str, correct: bool) -> None:
    assert math_reward(completion, gsm(gold)) == (1.0 if correct else 0.0)


def test_huge_inputs_are_bounded(number_reward: CorrectnessReward, math_reward: CorrectnessReward) -> None:
    filler = "blah {" * 200_000  # 1.2 MB of unbalanced braces
    assert number_reward(filler + " \\boxed{72}", gsm("72")) == 1.0  # the tail is still read
    assert number_reward("\\boxed{72}" + filler, gsm("72")) == 0.0  # the head is beyond the window
    assert number_reward("\\boxed{" + "7" * 5000 + "}", gsm("72")) == 0.0  # over-long answers score 0
    assert math_reward("\\boxed{" + "1+" * 3000 + "1}", gsm("3")) == 0.0


def test_format_bonus_and_counters() -> None:
    r = CorrectnessReward("number", format_reward=0.1)
    s = r.score("\\boxed{4}", gsm("4"))
    assert (s.correct, s.formatted, s.reward) == (True, True, 1.1)
    assert r("\\boxed{5}", gsm("4")) == pytest.approx(0.1)  # well-formed but wrong
    assert r("4", gsm("4")) == 0.0  # unboxed: no answer, no bonus
    assert r("\\boxed{4} \\boxed{4}", gsm("4")) == 0.0  # two boxes: two answers, no bonus
    counts = r.counters()
    assert counts["calls"] == 4 and counts["correct"] == 1 and counts["numeric"] == 2 and counts["no_answer"] == 2
    assert r.runner.starts == 0  # plain numbers never start the math-verify worker
    with pytest.raises(ValueError):
        CorrectnessReward("number", format_reward=1.5)
    assert make_reward_fn(TaskConfig(format_reward=0.2), "number", format_reward=0.0)("\\boxed{4}", gsm("4")) == 1.0


def test_threads_share_the_worker_and_pathological_input_times_out(runner: BoundedRunner) -> None:
    """Runs last in this module: the timeout replaces the shared worker."""
    reward = CorrectnessReward("math", timeout_s=1.0, runner=runner)
    cases = [
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("\\boxed{4}", "5", 0.0),
        ("\\boxed{0.25}", "\\frac{1}{4}", 1.0),
        ("\\boxed{x+1}", "1+x", 1.0),
        ("\\boxed{x+2}", "1+x", 0.0),
    ]
    with ThreadPoolExecutor(max_workers=3) as pool:
        got = list(pool.map(lambda c: reward(c[0], Problem(0, "q", c[1])), cases))
        assert got == [c[2] for c in cases]
        timeouts_before = runner.timeouts
        start = time.perf_counter()
        # sympy would evaluate a tower of powers for ever: the pre-screen refuses it without the verifier
        value = pool.submit(reward, "\\boxed{9^{9^{9^{9}}}}", Problem(0, "q", "3")).result()
        assert value == 0.0 and time.perf_counter() - start < 0.5
    assert runner.timeouts == timeouts_before and reward.counters()["prescreened"] == 1
    assert reward.counters()["math_verify"] == 4 and reward.counters()["numeric"] == 1  # 4 vs 5: plain numbers
