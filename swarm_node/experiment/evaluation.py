"""The grid's held-out evaluation: greedy pass@1 overall, per skill, and on an out-of-distribution set.

A skill is what a problem exercises: for arithmetic levels 1-2, its operation (`add` or `sub`,
`warmup.problem_op`); other problems have none. Each evaluation row (one node, one step) holds

    accuracy, n                      the whole held-out set
    accuracy_<skill>, n_<skill>      the held-out problems of each skill
    ood_accuracy, ood_n              the OOD set (`eval.ood_task`), when the spec names one
    ood_accuracy_<skill>, ood_n_<skill>

so a node's weak skill (the primary metric of a complementary-specialist sandbox) and the OOD set
(a secondary one) reach evals.jsonl and the summary. Step-0 rows are cached per model: every arm of
a seed starts from the same weights.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swarm_node.util.atomic import atomic_write_text
from swarm_node.tasks.base import Problem, PromptSet

SKILL_LEVELS = (1, 2)  # arithmetic levels whose problems are one addition or one subtraction


def skill_of(problem: Problem) -> str | None:
    """The operation of a level-1/2 arithmetic problem (`add` | `sub`); None for anything else (a
    question without two numbers whose sum or difference is the answer)."""
    from swarm_node.experiment.warmup import problem_op

    nums = [int(t) for t in problem.question.replace("?", " ").replace(".", " ").split() if t.isdigit()]
    if len(nums) != 2 or not problem.answer.lstrip("-").isdigit():
        return None
    a, b, answer = nums[0], nums[1], int(problem.answer)
    if a + b != answer and abs(a - b) != answer:
        return None
    return problem_op(problem)


def skill_accuracies(problems: Sequence[Problem], correct: Sequence[bool], prefix: str = "") -> dict[str, float]:
    """{prefix + "accuracy_<skill>": fraction correct, prefix + "n_<skill>": count} per skill present."""
    if len(problems) != len(correct):
        raise ValueError(f"{len(problems)} problems but {len(correct)} verdicts")
    by_skill: dict[str, list[bool]] = {}
    for p, ok in zip(problems, correct, strict=True):
        skill = skill_of(p)
        if skill is not None:
            by_skill.setdefault(skill, []).append(bool(ok))
    out: dict[str, float] = {}
    for skill in sorted(by_skill):
        vals = by_skill[skill]
        out[f"{prefix}accuracy_{skill}"] = sum(vals) / len(vals)
        out[f"{prefix}n_{skill}"] = len(vals)
    return out


class Evaluator:
    """Greedy pass@1 on the held-out set (and the OOD set); step-0 results are cached per model."""

    def __init__(self, spec: Any, heldout: PromptSet, system_prompt: str | None, cache: Path,
                 ood: PromptSet | None = None, worked_example: bool = False) -> None:
        from swarm_node.experiment.configs import eval_task
        from swarm_node.tasks import make_reward_fn

        self.spec, self.heldout, self.ood, self.system_prompt = spec, heldout, ood, system_prompt
        # the bare question, as the warm-up renders it (before: always so); a file whose nodes train with
        # task.worked_example = true evaluates without it unless this is set (sandbox_power sets it false)
        self.worked_example = worked_example
        self.reward_fn = make_reward_fn(eval_task(spec), heldout.answer_kind, format_reward=0.0)
        self.cache_path = cache
        self.cache = json.loads(cache.read_text()) if cache.exists() else {}
        self.model_keys: dict[str, str] = {}

    def _one(self, policy: Any, problems: PromptSet, prefix: str) -> dict[str, float]:
        from swarm_node.config import GenerationConfig
        from swarm_node.evaluation.evaluate import evaluate
        from swarm_node.policy.generation import HFGenerator

        e = self.spec.eval
        greedy = HFGenerator(policy, GenerationConfig())  # the policy's own module, greedy: no sampling settings
        r = evaluate(greedy, policy.tokenizer, problems, self.reward_fn, batch_size=e.batch_size,
                     max_new_tokens=e.max_new_tokens, system_prompt=self.system_prompt,
                     worked_example=self.worked_example, progress=False)
        correct = [rec["correct"] for rec in r["records"]]
        return {f"{prefix}accuracy": r["accuracy"], f"{prefix}n": r["n"],
                **skill_accuracies(problems.problems[: len(correct)], correct, prefix),
                f"{prefix}eval_seconds": round(r["seconds"], 3)}

    def __call__(self, node: str, policy: Any, step: int) -> dict:
        key = self.model_keys.get(node, node)
        if step == 0 and key in self.cache:
            return dict(self.cache[key])
        row = self._one(policy, self.heldout, "")
        if self.ood is not None:
            row.update(self._one(policy, self.ood, "ood_"))
        if step == 0:
            self.cache[key] = row
            atomic_write_text(self.cache_path, json.dumps(self.cache, indent=1))
        return row

    def close(self) -> None:
        self.reward_fn.close()
