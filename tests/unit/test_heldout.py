"""The built-in held-out set (tasks.heldout) and the node's evaluation log (heldout_eval)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from swarm_node.config import NodeConfig, TaskConfig
from swarm_node.evaluation.heldout import before_after, read_evals
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


class AnswerAll:
    """A fake generator whose greedy answers every held-out question right (it reads the question)."""

    def __init__(self, tok, heldout) -> None:
        self.tok, self.answers = tok, {p.question: p.answer for p in heldout.problems}
        self.calls = []

    def greedy(self, prompt_ids, max_new_tokens, batch_size):
        from swarm_node.policy.types import GreedyCompletion

        self.calls.append((len(prompt_ids), max_new_tokens, batch_size))
        out = []
        for ids in prompt_ids:
            text = self.tok.decode(ids)
            answer = next(a for q, a in self.answers.items() if q in text)
            tokens = self.tok(f"\\boxed{{{answer}}}", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append(GreedyCompletion(np.asarray(tokens, dtype=np.int64), "stop"))
        return out


def test_the_node_evaluates_through_its_generator(tmp_path):
    from tests.unit.test_evaluate import char_tokenizer

    from swarm_node.evaluation.heldout import HeldoutEvaluator

    tok = char_tokenizer()
    cfg = NodeConfig.load(None, [f"node_dir={json.dumps(str(tmp_path))}", "eval.problems=6", "eval.batch_size=4",
                                 "generation.max_new_tokens=12", "task.worked_example=false"])
    policy = SimpleNamespace(tokenizer=tok)
    train = load_prompt_set(cfg.task)
    held = disjoint_heldout(default_eval_task(cfg.task), [train], 6)
    gen = AnswerAll(tok, held)
    evaluator = HeldoutEvaluator(cfg, policy, gen, train)
    try:
        row = evaluator(0)
    finally:
        evaluator.close()
    assert (row["accuracy"], row["n"], row["correct"], row["heldout"]) == (1.0, 6, 6, held.id)
    assert gen.calls == [(6, 12, 4)]  # one call: 6 prompts, generation.max_new_tokens, eval.batch_size
    assert read_evals(tmp_path) == [row]


def test_held_out_prompts_longer_than_the_cap_are_refused(tmp_path):
    from tests.unit.test_evaluate import char_tokenizer

    from swarm_node.util.errors import InputError
    from swarm_node.evaluation.heldout import HeldoutEvaluator

    cfg = NodeConfig.load(None, [f"node_dir={json.dumps(str(tmp_path))}", "eval.problems=6",
                                 "generation.max_prompt_tokens=40"])  # chat template + question: more characters
    with pytest.raises(InputError, match="generation.max_prompt_tokens=40"):
        HeldoutEvaluator(cfg, SimpleNamespace(tokenizer=char_tokenizer()), None, load_prompt_set(cfg.task))
