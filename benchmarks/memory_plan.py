"""The memory plan (`swarm_node.policy.memory`) against the measured peak of real training steps.

    python -m benchmarks.memory_plan                 # tiny Llamas and the embedded SmolLM2-135M
    python -m benchmarks.memory_plan --quick         # two tiny Llamas, seconds
    python -m benchmarks.memory_plan --only 30m-bf16,smollm2

Each configuration runs in a fresh process (peak RSS cannot be reset): the model is loaded the
node's way (`models.load_policy`), samples are generated with every completion at its full length
(the plan is for the longest micro-batch) and alternating rewards (every row carries gradient),
and the project's `Trainer` takes two steps of `--prompts` micro-batches (AdamW's moments exist
from the first step on; later micro-batches of a step run beside the accumulated gradients). On
CPU the measured peak is the process's peak RSS (VmHWM), compared with the plan's total
(its baseline part included); a third step runs under the torch profiler, whose allocation
events give the allocator's peak (live tensor bytes), compared with the plan's `allocated` (no
baseline): the CPU's stand-in for `torch.cuda.max_memory_allocated`, which `--device cuda`
measures directly. `memory_estimate_ratio` is estimate / measured peak, per configuration.
Last line: one JSON object (benchmarks.common.emit).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import emit, parse_args

# name -> model, micro-batch rows, prompt tokens, completion tokens, compute dtype, lora, checkpointing
CONFIGS: dict[str, dict[str, Any]] = {
    "10m": {"model": "tiny-random:384x4-v8192", "rows": 8, "prompt": 128, "completion": 128},
    "30m": {"model": "tiny-random:512x6-v16000", "rows": 8, "prompt": 128, "completion": 128},
    "30m-bf16": {"model": "tiny-random:512x6-v16000", "rows": 8, "prompt": 128, "completion": 128,
                 "compute_dtype": "bfloat16"},
    "30m-ckpt": {"model": "tiny-random:512x6-v16000", "rows": 8, "prompt": 128, "completion": 128,
                 "checkpointing": True},
    "100m": {"model": "tiny-random:768x12-v32000", "rows": 8, "prompt": 128, "completion": 256},
    "100m-lora": {"model": "tiny-random:768x12-v32000", "rows": 8, "prompt": 128, "completion": 256, "lora": True},
    "smollm2": {"model": "smollm2-135m", "rows": 8, "prompt": 200, "completion": 256},
}
QUICK = "10m,30m"
RATIO_BOUNDS = (0.75, 1.33)


def plan_of(job: dict[str, Any], device: str) -> Any:
    """The plan for one configuration at the node's precision on `device`."""
    from swarm_node.config import LoraConfig, ModelConfig
    from swarm_node.node.memory_budget import model_step_plan

    model = ModelConfig(name=job["model"], compute_dtype=job.get("compute_dtype", "auto"),
                        lora=LoraConfig(enabled=bool(job.get("lora"))))
    return model_step_plan(model, device, micro_batch=job["rows"], prompt_tokens=job["prompt"],
                           completion_tokens=job["completion"], gradient_checkpointing=bool(job.get("checkpointing")))


# ---- the measurement (a fresh process per configuration) ----------------------------------------


def _samples(job: dict[str, Any], vocab: int) -> list[Any]:
    import numpy as np

    from swarm_node.policy.types import TrainSample

    rng = np.random.default_rng(0)
    out = []
    for g in range(job["prompts"]):
        prompt = rng.integers(3, vocab, job["prompt"])
        for k in range(job["rows"]):
            completion = rng.integers(3, vocab, job["completion"])
            out.append(TrainSample(group_key=str(g), prompt_ids=prompt, completion_ids=completion,
                                   generator_logprobs=np.full(job["completion"], -np.log(vocab), dtype=np.float32),
                                   reward=float(k % 2), is_peer=False))
    return out


def given_samples(rows: list[list[Any]]) -> list[Any]:
    """A batch passed in the job: [prompt ids, completion ids, generator logprobs, reward, group key] each."""
    import numpy as np

    from swarm_node.policy.types import TrainSample

    return [TrainSample(group_key=g, prompt_ids=np.asarray(p, dtype=np.int64),
                        completion_ids=np.asarray(c, dtype=np.int64),
                        generator_logprobs=np.asarray(lp, dtype=np.float32), reward=r, is_peer=False)
            for p, c, lp, r, g in rows]


def _allocated_peak(trainer: Any, samples: list[Any]) -> int:
    """Live tensor bytes at the allocator's peak during one more step: the bytes alive before it
    (weights, AdamW's moments) plus the running sum of the profiler's allocation events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def nbytes(t: Any) -> int:
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0

    live = {}
    for p in trainer.policy.model.parameters():
        live[p.untyped_storage().data_ptr()] = p.untyped_storage().nbytes()
    for state in trainer.optimizer.state.values():
        for t in state.values():
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                live[t.untyped_storage().data_ptr()] = nbytes(t)
    before = sum(live.values())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        trainer.step(samples)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return before + peak


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """Load, two training steps (peak RSS), a third under the profiler (allocator's peak)."""
    import torch

    from swarm_node.config import LoraConfig, ModelConfig, ObjectiveConfig, TrainConfig
    from swarm_node.policy.models import load_policy
    from swarm_node.policy.trainer import Trainer

    def rss() -> int:
        return peak_rss_bytes()

    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    imported = rss()
    cuda = job["device"] == "cuda"
    policy = load_policy(ModelConfig(name=job["model"], device=job["device"],
                                     compute_dtype=job.get("compute_dtype", "auto"),
                                     lora=LoraConfig(enabled=bool(job.get("lora")))))
    loaded = rss()
    samples = (given_samples(job["samples"]) if "samples" in job
               else _samples(job, policy.model.get_output_embeddings().weight.shape[0]))
    trainer = Trainer(policy, TrainConfig(learning_rate=1e-6, micro_batch_size=job["rows"],
                                          gradient_checkpointing=bool(job.get("checkpointing"))),
                      ObjectiveConfig(), temperature=1.0)
    t0 = time.perf_counter()
    trainer.step(samples)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    trainer.step(samples)
    seconds = time.perf_counter() - t0
    out = {"rss_after_imports": imported, "rss_after_load": loaded, "peak_rss": rss(), "two_steps_s": seconds}
    if cuda:
        torch.cuda.synchronize()
        out["allocated_peak"] = torch.cuda.max_memory_allocated()
    elif job.get("allocated", True):
        out["allocated_peak"] = _allocated_peak(trainer, samples)
    return out


def peak_rss_bytes() -> int:
    """This process's peak RSS: VmHWM, not `ru_maxrss`, which a child process inherits from its
    parent's peak across fork and exec (a child of a parent that held a model would report that)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def run_child(job: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """`measure(job)` in a fresh interpreter, so its peak RSS is the step's alone (also the device
    check's CPU measurement: `job["samples"]` then holds its batch)."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.memory_plan", "--child", json.dumps(job)],
                          capture_output=True, text=True, check=False, env=env or {**os.environ})
    if proc.returncode != 0:
        raise RuntimeError(f"{job['name']}: measurement failed:\n{proc.stderr.strip()[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(name: str, job: dict[str, Any], measured: dict[str, Any], device: str) -> dict[str, Any]:
    plan = plan_of(job, device)
    peak = measured["allocated_peak"] if device == "cuda" else measured["peak_rss"]
    estimate = plan.allocated if device == "cuda" else plan.total
    row = {**{k: v for k, v in job.items() if k not in ("name", "device")}, **measured,
           "plan_total": plan.total, "plan_allocated": plan.allocated, "plan_peak_phase": plan.peak_phase,
           "plan_parts": plan.by_name(), "memory_estimate_ratio": estimate / peak}
    if device == "cpu" and "allocated_peak" in measured:
        row["allocated_estimate_ratio"] = plan.allocated / measured["allocated_peak"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--prompts", type=int, default=2, help="micro-batches (one prompt's rows each) per step")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in each child (0: torch's default)")
    ap.add_argument("--no-allocated", action="store_true", help="CPU: skip the profiled step (peak RSS only)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", help=argparse.SUPPRESS)
    args = parse_args(ap, {"only": QUICK})
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return
    if args.prepare:
        prepare(args.prepare.split(","))
        return
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}: choose from {', '.join(CONFIGS)}")
    models = ",".join(CONFIGS[n]["model"] for n in names)
    prepare_models = [sys.executable, "-m", "benchmarks.memory_plan", "--prepare", models]
    subprocess.run(prepare_models, check=True, capture_output=True)  # apart: this process stays small
    rows = {}
    for name in names:
        job = {"name": name, **CONFIGS[name], "device": args.device, "prompts": args.prompts, "threads": args.threads,
               "allocated": not args.no_allocated}
        rows[name] = compare(name, job, run_child(job), args.device)
        r = rows[name]
        print(f"{name:>10}: measured {r['peak_rss'] / 2**30:.2f} GiB peak RSS, plan {r['plan_total'] / 2**30:.2f} GiB "
              f"(ratio {r['memory_estimate_ratio']:.2f})"
              + (f"; allocated {r['allocated_peak'] / 2**30:.2f} GiB, plan {r['plan_allocated'] / 2**30:.2f} GiB "
                 f"(ratio {r.get('allocated_estimate_ratio', r['memory_estimate_ratio']):.2f})"
                 if "allocated_peak" in r else ""), file=sys.stderr, flush=True)
    ratios = {n: r["memory_estimate_ratio"] for n, r in rows.items()}
    emit({"benchmark": "memory_plan", "device": args.device, "configs": rows, "memory_estimate_ratio": ratios,
          "allocated_estimate_ratio": {n: r["allocated_estimate_ratio"] for n, r in rows.items()
                                       if "allocated_estimate_ratio" in r},
          "within_bounds": all(RATIO_BOUNDS[0] <= v <= RATIO_BOUNDS[1] for v in ratios.values())})


def prepare(models: list[str]) -> None:
    """Build tiny models' directories (and convert the embedded one) before anything is measured."""
    from swarm_node.config import ModelConfig
    from swarm_node.policy import models as m
    from swarm_node.policy import tiny

    for name in dict.fromkeys(models):
        root = m.cache_root(ModelConfig(name=name))
        if tiny.is_tiny_spec(name):
            m.ensure_tiny_dir(name, root)
        elif name == m.EMBEDDED_NAME:
            m.ensure_embedded_dir(root)


if __name__ == "__main__":
    main()
