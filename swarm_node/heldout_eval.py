"""The node's own held-out evaluation: greedy pass@1 before its first step and after its last.

The held-out set is built from the node's task (`tasks.heldout`: same levels, another seed, no
question text of the training set), so every node of a local swarm with the same task evaluates on
the same problems. Each evaluation appends one row to `NODE_DIR/evals.jsonl`:

    {"step": 0, "accuracy": 0.23, "n": 64, "correct": 15, "seconds": 21.4, "heldout": "heldout-..."}

Rows are flushed and fsynced at once (there are two per run), so a killed node keeps what it wrote.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarm_node.config import NodeConfig
    from swarm_node.tasks.base import PromptSet

log = logging.getLogger(__name__)
EVALS_FILE = "evals.jsonl"


class HeldoutEvaluator:
    """`evaluator(step)` evaluates the policy's current weights and logs the row."""

    def __init__(self, cfg: NodeConfig, policy: Any, train_set: PromptSet) -> None:
        from swarm_node.tasks.heldout import default_eval_task, disjoint_heldout
        from swarm_node.tasks.registry import make_reward_fn

        self.cfg, self.policy = cfg, policy
        self.heldout = disjoint_heldout(default_eval_task(cfg.task), [train_set], cfg.eval.problems)
        self.reward_fn = make_reward_fn(cfg.task, self.heldout.answer_kind, format_reward=0.0)
        self.path = Path(cfg.node_dir) / EVALS_FILE

    def __call__(self, step: int) -> dict[str, Any]:
        from swarm_node.evaluate import evaluate

        e, task = self.cfg.eval, self.cfg.task
        log.info("held-out evaluation at step %d: %d problems, greedy", step, len(self.heldout))
        r = evaluate(self.policy.model, self.policy.tokenizer, self.heldout, self.reward_fn,
                     batch_size=e.batch_size, max_new_tokens=e.max_new_tokens or self.cfg.generation.max_new_tokens,
                     device=self.policy.device, system_prompt=task.system_prompt,
                     worked_example=task.worked_example, progress=False)
        row = {"step": step, "accuracy": r["accuracy"], "n": r["n"], "correct": r["correct"],
               "seconds": round(r["seconds"], 2), "heldout": self.heldout.id}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        log.info("held-out accuracy at step %d: %.3f (%d/%d, %.0fs)", step, r["accuracy"], r["correct"], r["n"],
                 r["seconds"])
        return row

    def close(self) -> None:
        self.reward_fn.close()


def read_evals(node_dir: Path) -> list[dict[str, Any]]:
    """A node's evaluation rows in order (a torn last line is skipped; no file: none)."""
    from swarm_node.local_view import read_rows

    return [row for row in read_rows(node_dir, EVALS_FILE) if "step" in row and "accuracy" in row]


def before_after(rows: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(accuracy at step 0, accuracy of the last evaluation after step 0) of one node."""
    before = next((float(r["accuracy"]) for r in rows if int(r["step"]) == 0), None)
    later = [r for r in rows if int(r["step"]) > 0]
    return before, (float(later[-1]["accuracy"]) if later else None)
