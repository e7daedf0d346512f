"""What a newcomer's first `make run` shows: the default `swarm-node local`, measured.

    python -m benchmarks.first_run [--steps 10] [--run-dir DIR] [--eval-problems 64]

Runs `swarm-node local` exactly as `make run` does (embedded SmolLM2-135M, two nodes, full and
LoRA, built-in arithmetic, held-out evaluation before and after) and prints, per node: mean
training reward by quarter of the run, the fraction of groups with mixed rewards, held-out
accuracy before and after, peer samples that carried gradient; and the wall time of the whole
command. The run directory is kept (logs, metrics, report).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import emit
from swarm_node import metric_names as m
from swarm_node.observe.metrics import read_metrics_jsonl
from swarm_node.util.jsonl import latest_run
from swarm_node.evaluation.heldout import read_evals
from swarm_node.observe.report import summarize


def quarters(values: list[float]) -> list[float | None]:
    """Means of the four quarters of `values` (the last takes the remainder)."""
    q = max(1, len(values) // 4)
    cuts = [values[:q], values[q:2 * q], values[2 * q:3 * q], values[3 * q:]]
    return [round(sum(c) / len(c), 3) if c else None for c in cuts]


def node_result(node_dir: Path) -> dict:
    rows = latest_run(read_metrics_jsonl(node_dir / "metrics.jsonl"))
    rewards = [float(r[m.REWARD_MEAN]) for r in rows]
    s = summarize(node_dir.name, rows, evals=read_evals(node_dir))
    return {"steps": s.steps, "reward_by_quarter": quarters(rewards),
            "reward_mean": round(sum(rewards) / len(rewards), 3) if rewards else None,
            "mixed_groups": round(s.mixed_groups_mean, 3) if s.mixed_groups_mean is not None else 0.0,
            "heldout_before": s.heldout_before, "heldout_after": s.heldout_after,
            "peer_samples_gradient": s.peer_samples_gradient,
            "step_seconds_mean": round(sum(float(r["step_seconds"]) for r in rows) / max(1, len(rows)), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="default: the command's own default")
    ap.add_argument("--eval-problems", type=int, default=None, help="default: the command's own default")
    ap.add_argument("--run-dir", type=Path, default=None)
    args = ap.parse_args()
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="first-run-")) / "run"
    cmd = [sys.executable, "-m", "swarm_node", "local", "--run-dir", str(run_dir)]
    cmd += ["--steps", str(args.steps)] if args.steps else []
    cmd += ["--eval-problems", str(args.eval_problems)] if args.eval_problems else []
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    print(proc.stdout[-3000:], flush=True)
    nodes = {d.name: node_result(d) for d in sorted(run_dir.glob("node*")) if (d / "metrics.jsonl").exists()}
    emit({"benchmark": "first_run", "command": " ".join(cmd[2:]), "rc": proc.returncode,
          "wall_seconds": round(wall, 1), "run_dir": str(run_dir), "nodes": nodes})
    if proc.returncode != 0:
        raise SystemExit(proc.returncode)


if __name__ == "__main__":
    main()
