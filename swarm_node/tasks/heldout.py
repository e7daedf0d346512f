"""Held-out problems: a set no node trains on, by question text; and a validation split beside it.

A held-out set is drawn from an evaluation task (for the built-in arithmetic task, the same levels
under another seed) and keeps only problems whose question text appears in none of the training
sets nor in any other text the nodes learned from (`exclude`: an experiment's supervised warm-up
data), so a held-out score measures problems a node has not been trained on. For level-1 arithmetic
that removes the direct questions ("What is 3 plus 4?": there are only 162 of them, and a training
set of 10,000 holds them all) and keeps the word problems: same arithmetic, new wording.

Every question belongs to one of two splits by a hash of its text (`split_of`): one in
`VALIDATION_EVERY` to `validation`, the rest to `heldout`. Settings (a learning rate, g, a sandbox's
mix) are chosen on the validation split, claims read from the held-out one; the two are disjoint
whatever their sizes, seeds or tasks, and the held-out set is the same whether a validation split
is ever used.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Literal

from swarm_node.config import TaskConfig
from swarm_node.tasks.base import PromptSet, content_id

HELDOUT_SEED_OFFSET = 1_000_003  # the default held-out arithmetic seed is the training seed plus this
VALIDATION_EVERY = 4  # one question in 4 belongs to the validation split
Split = Literal["heldout", "validation"]


def split_of(question: str) -> Split:
    """The evaluation split of a question: fixed by the sha256 of its stripped text."""
    digest = hashlib.sha256(b"swarm-node-split:" + question.strip().encode()).digest()
    return "validation" if int.from_bytes(digest[:4], "little") % VALIDATION_EVERY == 0 else "heldout"


def default_eval_task(train: TaskConfig) -> TaskConfig:
    """The evaluation task of `train` (arithmetic: same levels, another seed), or ValueError when the
    task has no built-in held-out source (pass one explicitly)."""
    if train.name != "arithmetic":
        raise ValueError(f"task {train.name!r} has no built-in held-out set; evaluate with `swarm-node eval` "
                         "on its test split")
    return train.model_copy(update={"seed": train.seed + HELDOUT_SEED_OFFSET})


def disjoint_heldout(eval_task: TaskConfig, train_sets: Sequence[PromptSet], problems: int, *,
                     exclude: Iterable[str] = (), split: Split = "heldout") -> PromptSet:
    """The first `problems` problems of `eval_task` in `split` whose question text no training set
    contains and `exclude` (more questions learned from, e.g. warm-up data) does not list."""
    from swarm_node.tasks.registry import load_prompt_set

    seen = {p.question.strip() for ps in train_sets for p in ps.problems} | {q.strip() for q in exclude}
    if eval_task.name == "arithmetic":
        share = VALIDATION_EVERY if split == "validation" else 1
        eval_task = eval_task.model_copy(update={"size": max(eval_task.size, 20 * problems * share)})
    pool = load_prompt_set(eval_task)
    kept = [p for p in pool.problems
            if p.question.strip() not in seen and split_of(p.question) == split][:problems]
    if len(kept) < problems:
        raise ValueError(f"only {len(kept)} {'held-out' if split == 'heldout' else split} problems remain after removing training problems; "
                         f"{problems} were asked for: use another evaluation task seed or fewer problems")
    return PromptSet(id=content_id(f"{split}-{eval_task.name}", kept), answer_kind=pool.answer_kind,
                     problems=tuple(kept))
