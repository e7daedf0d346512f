"""The procedural arithmetic task: determinism, correct answers at every level, set ids."""

from __future__ import annotations

import re

import pytest

from swarm_node.config import TaskConfig
from swarm_node.tasks import load_prompt_set
from swarm_node.tasks.arithmetic import MAX_LEVEL, arithmetic_problem, arithmetic_prompt_set


def _solve(question: str) -> int:
    """An independent solver for every template (parses the numbers back out of the text)."""
    n = [int(x) for x in re.findall(r"\d+", question)]
    q = question
    if q.startswith("What is"):
        expr = q[len("What is "):-1].replace("plus", "+").replace("minus", "-").replace("times", "*")
        return int(eval(expr, {"__builtins__": {}}))  # digits and + - * only (checked below)
    if "gives away" in q:
        return n[0] * n[1] + n[2] - n[3]
    if "gives" in q and "more" in q and "has" in q:
        return n[0] + n[1]
    if "on a table" in q:
        return n[0] + n[1]
    if "gives" in q and "of them" in q or "takes out" in q:
        return n[0] - n[1]
    if "with" in q and "in each. How many" in q and "buys" not in q:
        return n[0] * n[1]
    if "pays with" in q:
        return n[2] - n[0] * n[1]
    if q.count(".") >= 2 and "buys" in q and "in each. How many" in q:
        return n[0] + n[1] * n[2]
    if "share them all equally" in q:
        people = n[3] + 1
        return (n[0] * n[1] + n[2]) // people
    if "A shop has" in q:
        rest = n[0] + n[1] * n[2] - n[3]
        return rest - rest // 2
    raise AssertionError(f"unknown template: {q}")


@pytest.mark.parametrize("level", range(1, MAX_LEVEL + 1))
def test_answers_are_correct_and_nonnegative(level: int) -> None:
    for i in range(60):
        p = arithmetic_problem(7, level, i)
        if p.question.startswith("What is"):
            assert re.fullmatch(r"What is [\d a-z]+\?", p.question)
        assert int(p.answer) == _solve(p.question), p.question
        assert int(p.answer) >= 0
        assert p.index == i


def test_levels_have_the_promised_number_sizes() -> None:
    l1 = [arithmetic_problem(0, 1, i) for i in range(200)]
    assert all(int(x) <= 9 for p in l1 for x in re.findall(r"\d+", p.question))
    l2 = [arithmetic_problem(0, 2, i) for i in range(200)]
    assert all(10 <= int(x) <= 99 for p in l2 for x in re.findall(r"\d+", p.question))
    assert any("times" in arithmetic_problem(0, 3, i).question for i in range(50))


def test_deterministic_and_seed_dependent() -> None:
    a = [arithmetic_problem(3, 2, i) for i in range(50)]
    b = [arithmetic_problem(3, 2, i) for i in range(50)]
    c = [arithmetic_problem(4, 2, i) for i in range(50)]
    assert a == b
    assert [p.question for p in a] != [p.question for p in c]
    # several templates appear
    assert len({p.question.split()[1] for p in a}) > 3


def test_prompt_set_cycles_levels_and_has_content_id() -> None:
    s = arithmetic_prompt_set([1, 3], 20, seed=0)
    assert len(s) == 20 and s.answer_kind == "number"
    assert s.problems[4] == arithmetic_problem(0, 1, 4)
    assert s.problems[5] == arithmetic_problem(0, 3, 5)
    assert s.id.startswith("arithmetic-")
    assert arithmetic_prompt_set([1, 3], 20, seed=0).id == s.id
    assert arithmetic_prompt_set([1, 3], 21, seed=0).id != s.id
    assert arithmetic_prompt_set([1, 3], 20, seed=1).id != s.id


def test_load_prompt_set_uses_config_and_rejects_bad_levels() -> None:
    s = load_prompt_set(TaskConfig(levels=[2], size=5, seed=9))
    assert s.problems == tuple(arithmetic_problem(9, 2, i) for i in range(5))
    with pytest.raises(ValueError):
        TaskConfig(levels=[0])
    with pytest.raises(ValueError):
        TaskConfig(levels=[])
    with pytest.raises(ValueError):
        arithmetic_problem(0, MAX_LEVEL + 1, 0)


def _solve_unseen(question: str) -> int:
    """An independent solver for the `unseen` wording's templates."""
    n = [int(x) for x in re.findall(r"\d+", question)]
    if "in the morning" in question or question.startswith("Add "):
        return n[0] + n[1]
    if "lost" in question or "are red" in question:
        return n[0] - n[1]
    raise AssertionError(f"unknown template: {question}")


@pytest.mark.parametrize("level", [1, 2])
def test_unseen_wording_is_correct_and_shares_no_sentence_with_the_standard_wording(level: int) -> None:
    from swarm_node.experiment.warmup import problem_op

    unseen = [arithmetic_problem(5, level, i, "unseen") for i in range(400)]
    standard = [arithmetic_problem(5, level, i) for i in range(400)]
    lo, hi = (1, 9) if level == 1 else (10, 99)
    for p in unseen:
        assert int(p.answer) == _solve_unseen(p.question) >= 0, p.question
        assert all(lo <= int(x) <= hi for x in re.findall(r"\d+", p.question))
        # the evaluation's per-skill split reads the operation from the numbers
        assert problem_op(p) == ("add" if int(p.answer) == sum(int(x) for x in re.findall(r"\d+", p.question)[:2]) else "sub")

    def sentences(ps):
        return {re.sub(r"\d+", "N", s.strip()) for p in ps for s in re.split(r"[.?]", p.question) if s.strip()}

    assert not sentences(unseen) & sentences(standard)
    assert {problem_op(p) for p in unseen} == {"add", "sub"}
    assert len({p.question for p in unseen}) > 300  # names and items: far more than the 81 number pairs
    assert unseen == [arithmetic_problem(5, level, i, "unseen") for i in range(400)]  # deterministic


def test_unseen_wording_through_the_config_and_its_bounds() -> None:
    s = load_prompt_set(TaskConfig(levels=[1], size=8, seed=3, wording="unseen"))
    assert s.problems == tuple(arithmetic_problem(3, 1, i, "unseen") for i in range(8))
    assert s.id != load_prompt_set(TaskConfig(levels=[1], size=8, seed=3)).id
    with pytest.raises(ValueError, match="levels 1-2 only"):
        TaskConfig(levels=[1, 3], wording="unseen")
    with pytest.raises(ValueError, match="levels 1-2 only"):
        TaskConfig(name="gsm8k", wording="unseen")
    with pytest.raises(ValueError):
        TaskConfig(wording="other")
    with pytest.raises(ValueError, match="levels 1-2 only"):
        arithmetic_problem(0, 3, 0, "unseen")
    with pytest.raises(ValueError, match="wording must be one of"):
        arithmetic_problem(0, 1, 0, "other")
