"""The built-in held-out set (tasks.heldout) and the node's evaluation log (heldout_eval)."""

from __future__ import annotations

import json

import pytest

from swarm_node.config import NodeConfig, TaskConfig
from swarm_node.heldout_eval import before_after, read_evals
from swarm_node.tasks.heldout import default_eval_task, disjoint_heldout
from swarm_node.tasks.registry import load_prompt_set


def test_heldout_shares_no_question_with_training_and_is_fixed():
    train = TaskConfig()
    train_set = load_prompt_set(train)
    held = disjoint_heldout(default_eval_task(train), [train_set], 64)
    assert len(held) == 64
    assert not {p.question for p in held.problems} & {p.question for p in train_set.problems}
    again = disjoint_heldout(default_eval_task(train), [load_prompt_set(train)], 64)
    assert again.id == held.id  # every node of a swarm evaluates on the same problems


def test_heldout_too_small_and_other_tasks_are_refused():
    # The same seed as training: every problem of the pool (20 x 10) is a training problem.
    with pytest.raises(ValueError, match="only 0 held-out problems remain"):
        disjoint_heldout(TaskConfig(size=5), [load_prompt_set(TaskConfig(size=200))], 10)
    with pytest.raises(ValueError, match="no built-in held-out set"):
        default_eval_task(TaskConfig(name="gsm8k", source="x.jsonl"))
    with pytest.raises(ValueError, match="eval.problems needs a built-in held-out set"):
        NodeConfig.load(None, ['task.name="gsm8k"', 'task.source="x.jsonl"', "eval.problems=8"])


def test_evals_log_before_and_after(tmp_path):
    rows = [{"step": 0, "accuracy": 0.25, "n": 8}, {"step": 5, "accuracy": 0.5, "n": 8},
            {"step": 12, "accuracy": 0.625, "n": 8}]
    (tmp_path / "evals.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"step\": 1")  # torn tail
    read = read_evals(tmp_path)
    assert [r["step"] for r in read] == [0, 5, 12]
    assert before_after(read) == (0.25, 0.625)
    assert before_after(read[:1]) == (0.25, None)
    assert before_after([]) == (None, None)
