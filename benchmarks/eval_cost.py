"""What one held-out evaluation costs against one training step: the measure behind
`eval.every_steps`'s default (config.EVAL_EVERY_STEPS).

    python -m benchmarks.eval_cost                          # the embedded default at `join`'s settings
    python -m benchmarks.eval_cost --preset local           # ... at `swarm-node local`'s settings
    python -m benchmarks.eval_cost --model tiny-random:64x1:a --preset tests   # the integration tests' node
    python -m benchmarks.eval_cost --quick                  # seconds: tiny model, 2 steps, 8 problems

One node trains alone, built as `swarm-node train` builds it (`assemble.build_parts`, swarm off):
one untimed step (warm-up), `--steps` timed steps, then `--evals` timed held-out evaluations of
`--problems` problems through the node's own evaluator (greedy through its generator, at
eval.batch_size and the evaluation's token cap). `ratio` = median evaluation seconds / median step
seconds; `overhead_at_every[N]` = the share of a run's time the evaluations take when they run
every N steps: eval / (N * step + eval). Threads: `--threads` (default: torch's, a node's; `local`'s
nodes run one each), stated in the line. Each step's and evaluation's seconds go to stderr as they end.
Last line: one JSON object (benchmarks.common.emit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import emit, parse_args, peak_rss_mib
from swarm_node.node.assemble import build_parts
from swarm_node.config import NodeConfig
from swarm_node.ops.local import LOCAL_DEFAULTS
from swarm_node.node.loop import Node

PRESETS: dict[str, list[str]] = {
    "join": [],  # NodeConfig's defaults: what `swarm-node join` and `train` run without options
    "local": LOCAL_DEFAULTS,
    "tests": ["generation.group_size=4", "generation.max_new_tokens=8", "train.prompts_per_step=2",
              "task.levels=[1]", "task.size=50"],  # tests/procs.py's tiny node
}
EVERY = (1, 5, 10, 20, 50)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="join")
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--evals", type=int, default=1)
    ap.add_argument("--cache", default=None, help="model cache directory (default: a temporary one)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parse_args(ap, {"model": "tiny-random:64x1:a", "preset": "tests", "problems": 8, "steps": 2})
    if args.threads:
        torch.set_num_threads(args.threads)
    node_dir = Path(tempfile.mkdtemp(prefix="bench-eval-cost-"))
    cache = args.cache or str(node_dir / "cache")
    overrides = [*PRESETS[args.preset], f"model.name={json.dumps(args.model)}", f"model.cache_dir={json.dumps(cache)}",
                 f"node_dir={json.dumps(str(node_dir))}", "swarm.enabled=false", "swarm.max_peer_fraction=0.0",
                 f"eval.problems={args.problems}", "eval.every_steps=0", "checkpoint.every_steps=1000000",
                 f"train.total_steps={args.steps + 1}"]
    cfg = NodeConfig.load(None, overrides)
    parts, _ = build_parts(cfg)
    node = Node(parts)
    assert parts.evaluate is not None
    try:
        node.run_step()  # warm-up: first allocations, kernels chosen
        step_s, eval_s, accuracy = [], [], []
        for _ in range(args.steps):
            step_s.append(node.run_step()["step_seconds"])
            print(f"step {node.step}: {step_s[-1]:.1f}s", file=sys.stderr, flush=True)
        for _ in range(args.evals):
            t = time.perf_counter()
            row = parts.evaluate(node.step)
            eval_s.append(time.perf_counter() - t)
            accuracy.append(row["accuracy"])
            print(f"evaluation: {eval_s[-1]:.1f}s", file=sys.stderr, flush=True)
    finally:
        for hook in reversed(parts.close_hooks):
            hook()
    step, ev = statistics.median(step_s), statistics.median(eval_s)
    emit({
        "benchmark": "eval_cost", "model": args.model, "preset": args.preset, "problems": args.problems,
        "eval_batch_size": cfg.eval.batch_size,
        "eval_max_new_tokens": cfg.eval.max_new_tokens or cfg.generation.max_new_tokens,
        "group_size": cfg.generation.group_size, "prompts_per_step": cfg.train.prompts_per_step,
        "max_new_tokens": cfg.generation.max_new_tokens, "torch_threads": torch.get_num_threads(),
        "step_seconds": [round(s, 2) for s in step_s], "eval_seconds": [round(s, 2) for s in eval_s],
        "step_median_s": round(step, 2), "eval_median_s": round(ev, 2), "ratio": round(ev / step, 3),
        "overhead_at_every": {n: round(ev / (n * step + ev), 4) for n in EVERY},
        "heldout_accuracy": accuracy, "peak_rss_mib": round(peak_rss_mib()),
    })


if __name__ == "__main__":
    main()
