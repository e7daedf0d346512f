"""Held-out problems: a set no node trains on, by question text.

A held-out set is drawn from an evaluation task (for the built-in arithmetic task, the same levels
under another seed) and keeps only problems whose question text appears in none of the training
sets, so a held-out score measures problems a node has not been trained on. For level-1 arithmetic
that removes the direct questions ("What is 3 plus 4?": there are only 162 of them, and a training
set of 10,000 holds them all) and keeps the word problems: same arithmetic, new wording.
"""

from __future__ import annotations

from collections.abc import Sequence

from swarm_node.config import TaskConfig
from swarm_node.tasks.base import PromptSet, content_id

HELDOUT_SEED_OFFSET = 1_000_003  # the default held-out arithmetic seed is the training seed plus this


def default_eval_task(train: TaskConfig) -> TaskConfig:
    """The evaluation task of `train` (arithmetic: same levels, another seed), or ValueError when the
    task has no built-in held-out source (pass one explicitly)."""
    if train.name != "arithmetic":
        raise ValueError(f"task {train.name!r} has no built-in held-out set; evaluate with `swarm-node eval` "
                         "on its test split")
    return train.model_copy(update={"seed": train.seed + HELDOUT_SEED_OFFSET})


def disjoint_heldout(eval_task: TaskConfig, train_sets: Sequence[PromptSet], problems: int) -> PromptSet:
    """The first `problems` problems of `eval_task` whose question text no training set contains."""
    from swarm_node.tasks.registry import load_prompt_set

    seen = {p.question.strip() for ps in train_sets for p in ps.problems}
    if eval_task.name == "arithmetic":
        eval_task = eval_task.model_copy(update={"size": max(eval_task.size, 20 * problems)})
    pool = load_prompt_set(eval_task)
    kept = [p for p in pool.problems if p.question.strip() not in seen][:problems]
    if len(kept) < problems:
        raise ValueError(f"only {len(kept)} held-out problems remain after removing training problems; "
                         f"{problems} were asked for: use another evaluation task seed or fewer problems")
    return PromptSet(id=content_id(f"heldout-{eval_task.name}", kept), answer_kind=pool.answer_kind,
                     problems=tuple(kept))
