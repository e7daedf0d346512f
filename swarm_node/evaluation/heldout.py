"""The node's own held-out evaluation: greedy pass@1 before its first step, every
`eval.every_steps` steps and after its last, decoded by the node's generator (`Generator.greedy`).

The held-out set is built from the node's task (`tasks.heldout`: same levels, another seed, no
question text of the training set), so every node of a local swarm with the same task evaluates on
the same problems. Each evaluation appends one row to `NODE_DIR/evals.jsonl`:

    {"step": 0, "accuracy": 0.23, "n": 64, "correct": 15, "lo": 0.15, "hi": 0.35, "seconds": 21.4,
     "heldout": "heldout-...", "outcomes": "0010...1"}

`lo`, `hi`: the accuracy's 95% Wilson interval (`evaluation.stats`); `outcomes`: one character per
problem of the set, in its order ('1' right, '0' wrong), so that two rows of one node compare
problem by problem (`evaluation.stats.compare`). Rows are flushed and fsynced at once (an evaluation
costs far more than a write), so a killed node keeps what it wrote. The latest row also goes into
every later step's metrics (`eval_metrics`: `eval_accuracy`, `eval_step`, `eval_lo`, `eval_hi`,
`eval_n`, `eval_seconds`), hence into the status record observers read.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarm_node import metric_names as m
from swarm_node.util.jsonl import latest_run, read_rows
from swarm_node.evaluation.stats import Accuracy, Change, compare, wilson

if TYPE_CHECKING:
    from swarm_node.config import NodeConfig
    from swarm_node.policy.types import Generator
    from swarm_node.tasks.base import PromptSet

log = logging.getLogger(__name__)
EVALS_FILE = "evals.jsonl"


class HeldoutEvaluator:
    """`evaluator(step)` evaluates the policy's current weights through the node's generator (the
    engine that samples its groups: vLLM where the node runs it, greedy) and logs the row."""

    def __init__(self, cfg: NodeConfig, policy: Any, generator: Generator, train_set: PromptSet) -> None:
        from swarm_node.tasks.heldout import default_eval_task, disjoint_heldout
        from swarm_node.tasks.prompt_lengths import check_prompt_lengths
        from swarm_node.tasks.registry import make_reward_fn

        self.cfg, self.policy, self.generator = cfg, policy, generator
        self.heldout = disjoint_heldout(default_eval_task(cfg.task), [train_set], cfg.eval.problems)
        # the engine was sized for prompts of generation.max_prompt_tokens (vllm_engine.node_demand)
        check_prompt_lengths(policy.tokenizer, self.heldout.problems, self.heldout.id, cfg.generation.max_prompt_tokens,
                             cfg.task.system_prompt, cfg.task.worked_example)
        self.reward_fn = make_reward_fn(cfg.task, self.heldout.answer_kind, format_reward=0.0)
        self.path = Path(cfg.node_dir) / EVALS_FILE

    def __call__(self, step: int) -> dict[str, Any]:
        from swarm_node.evaluation.evaluate import evaluate

        e, task = self.cfg.eval, self.cfg.task
        log.info("held-out evaluation at step %d: %d problems, greedy", step, len(self.heldout))
        r = evaluate(self.generator, self.policy.tokenizer, self.heldout, self.reward_fn,
                     batch_size=e.batch_size, max_new_tokens=e.max_new_tokens or self.cfg.generation.max_new_tokens,
                     system_prompt=task.system_prompt, worked_example=task.worked_example, progress=False)
        lo, hi = wilson(r["correct"], r["n"])
        row = {"step": step, "accuracy": r["accuracy"], "n": r["n"], "correct": r["correct"], "lo": round(lo, 6),
               "hi": round(hi, 6), "seconds": round(r["seconds"], 2), "heldout": self.heldout.id,
               "outcomes": "".join("1" if rec["correct"] else "0" for rec in r["records"])}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        log.info("held-out accuracy at step %d: %.3f [%.3f, %.3f] (%d/%d, %.0fs)", step, r["accuracy"], lo, hi,
                 r["correct"], r["n"], r["seconds"])
        return row

    def close(self) -> None:
        self.reward_fn.close()


def due(step: int, every_steps: int, last_step: int | None) -> bool:
    """Whether the node evaluates after finishing `step`: every `every_steps` steps (0: never in
    between) and after the run's last step `last_step` (None: the run's end is not known)."""
    return step > 0 and (step == last_step or (every_steps > 0 and step % every_steps == 0))


def eval_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The step metrics that carry an evaluation row (metric_names.EVAL_*)."""
    lo, hi = interval_of(row)
    return {m.EVAL_ACCURACY: float(row["accuracy"]), m.EVAL_STEP: float(row["step"]), m.EVAL_LO: lo,
            m.EVAL_HI: hi, m.EVAL_N: float(row["n"]), m.EVAL_SECONDS: float(row.get("seconds", 0.0))}


def latest_metrics(node_dir: Path, step: int) -> dict[str, float]:
    """The metrics of a node's latest evaluation at or before `step` (a node resuming there)."""
    rows = [r for r in read_evals(Path(node_dir)) if int(r["step"]) <= step]
    return eval_metrics(rows[-1]) if rows else {}


def read_evals(node_dir: Path) -> list[dict[str, Any]]:
    """A node's evaluation rows in order (a torn last line is skipped; no file: none). A node that
    resumed from an older checkpoint evaluates those steps again: as in metrics.jsonl, a step that
    does not increase starts a new run whose rows supersede the earlier ones (`util.jsonl.latest_run`)."""
    return latest_run([row for row in read_rows(node_dir, EVALS_FILE) if "step" in row and "accuracy" in row])


def accuracy_of(row: Mapping[str, Any]) -> Accuracy:
    """An evaluation row's accuracy as correct of n (rows without `correct`: rounded from the accuracy)."""
    n = int(row["n"])
    return Accuracy(int(row["correct"]) if "correct" in row else round(float(row["accuracy"]) * n), n)


def interval_of(row: Mapping[str, Any]) -> tuple[float, float]:
    """The row's 95% Wilson interval (computed for rows written before it was logged)."""
    if "lo" in row and "hi" in row:
        return float(row["lo"]), float(row["hi"])
    return accuracy_of(row).interval


def before_after_rows(rows: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """(the step-0 row, the last row after step 0) of one node; None where there is none."""
    before = next((r for r in rows if int(r["step"]) == 0), None)
    later = [r for r in rows if int(r["step"]) > 0]
    return before, (later[-1] if later else None)


def before_after(rows: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(accuracy at step 0, accuracy of the last evaluation after step 0) of one node."""
    before, after = before_after_rows(rows)
    return (float(before["accuracy"]) if before is not None else None,
            float(after["accuracy"]) if after is not None else None)


def change_between(before: Mapping[str, Any], after: Mapping[str, Any]) -> Change:
    """The verdict on two rows of one node: paired (McNemar) when both carry the outcomes of the
    same held-out set, else by Newcombe's interval (`evaluation.stats.compare`)."""
    paired = (before.get("heldout") == after.get("heldout") and isinstance(before.get("outcomes"), str)
              and isinstance(after.get("outcomes"), str) and len(before["outcomes"]) == len(after["outcomes"]))
    outcomes = (before["outcomes"], after["outcomes"]) if paired else (None, None)
    return compare(accuracy_of(before), accuracy_of(after), outcomes)


def trend_points(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One point per evaluation row: step, accuracy, lo, hi, n, correct, seconds, and the change
    from the first row (`change`: verdict, test, difference, p_value, gained, lost, diff_lo,
    diff_hi; None on the first row itself)."""
    points = []
    for i, row in enumerate(rows):
        acc, (lo, hi) = accuracy_of(row), interval_of(row)
        change = change_between(rows[0], row) if i > 0 else None
        points.append({"step": int(row["step"]), "accuracy": acc.value, "lo": lo, "hi": hi, "n": acc.n,
                       "correct": acc.correct, "seconds": float(row.get("seconds", 0.0)),
                       "change": vars(change) if change is not None else None})
    return points
