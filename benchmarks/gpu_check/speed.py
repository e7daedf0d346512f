"""The device check's speed and memory per shape (4): generation and training tokens/s, the training
step's peak memory against the node's memory plan (CUDA: the allocator's peak, read after the generator
is closed and its memory collected; CPU: the peak RSS of a fresh process taking the step,
`benchmarks.memory_plan.run_child`), and an MFU estimate on CUDA. On CUDA it also records what the
plan's stated CUDA constants are to be measured against (`swarm_node.policy.memory`): the caching
allocator's reserved peak over its allocated peak during the step (CUDA_ALLOCATOR_RESERVE), and the
device memory in use beyond torch's reservation (the CUDA context, CUDA_CONTEXT_BYTES)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import Timer
from benchmarks.gpu_check.parts import (
    ENV_AT_START, NODE, SHAPES, Build, GenSettings, fixed_prompts, free, model_cfg, own_samples, sync_device,
    train_cfg,
)

# dense bf16 peak FLOP/s by GPU name fragment (vendor data sheets), for the MFU estimate
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12,
             "RTX 4090": 165e12, "RTX 3090": 71e12}

def shape_check(args: argparse.Namespace, name: str, cache: Path, node: Build = NODE) -> dict[str, Any]:
    """Generation and training speed of one shape at the default precision, and its memory against
    the plan (a fresh process per measurement on CPU, where peak RSS cannot be reset)."""
    spec = SHAPES[name]
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    policy = node.policy(model_cfg(args, spec, cache), 0)
    params = sum(p.numel() for p in policy.model.parameters())
    generator = node.generator(args, policy, GenSettings())
    prompts = fixed_prompts(policy, args.prompts)
    sync_device(args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with Timer() as t_gen:
        groups = generator.generate(prompts, args.group_size)
        sync_device(args.device)
    gen_peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else None
    gen_tokens = sum(len(c.token_ids) for g in groups for c in g)
    generator.close()
    del generator
    free(args.device)  # an engine's memory still referenced would count as the trainer's
    samples = own_samples(prompts, groups, seed=3)
    trainer = node.trainer(policy, train_cfg(args, 1e-6), 1.0)
    trainer.step(samples)  # warm-up (allocator, kernels): the measured step is the second
    sync_device(args.device)
    if args.device == "cuda":
        free(args.device)
        before_step = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    with Timer() as t_train:
        trainer.step(samples)
        sync_device(args.device)
    train_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    out: dict[str, Any] = {
        "spec": spec, "parameters": params, "compute_dtype": str(policy.compute_dtype).removeprefix("torch."),
        "generation": {"seconds": t_gen.seconds, "tokens": gen_tokens, "tokens_per_s": gen_tokens / t_gen.seconds},
        "training": {"seconds": t_train.seconds, "tokens": train_tokens,
                     "tokens_per_s": train_tokens / t_train.seconds},
    }
    job = {"spec": spec, "device": args.device, "cache": str(cache), "micro_batch": args.micro_batch,
           "group_size": args.group_size, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
           "samples": [[s.prompt_ids.tolist(), s.completion_ids.tolist(), s.generator_logprobs.tolist(), s.reward,
                        s.group_key] for s in samples],
           "model_config": policy.model.config.to_dict(), "compute_dtype": out["compute_dtype"]}
    if args.device == "cuda":
        train_peak = torch.cuda.max_memory_allocated()
        reserved_peak = torch.cuda.max_memory_reserved()
        free_now, total = torch.cuda.mem_get_info()
        estimate = estimate_step_bytes(job)
        out["memory"] = {"generation_peak_bytes": gen_peak, "training_peak_bytes": train_peak,
                         "training_estimate_bytes": estimate, "allocated_before_step_bytes": before_step,
                         "training_reserved_peak_bytes": reserved_peak,
                         # measured values for the plan's stated CUDA constants (policy.memory):
                         "allocator_reserve_measured": reserved_peak / train_peak,
                         "outside_torch_bytes_measured": total - free_now - torch.cuda.memory_reserved()}
        peak_flops = next((v for k, v in PEAK_BF16.items() if k in torch.cuda.get_device_name(0)), None)
        if peak_flops:
            out["mfu"] = 6 * params * train_tokens / t_train.seconds / peak_flops
    else:
        del policy, trainer
        free(args.device)
        from benchmarks.memory_plan import run_child

        measured = run_child({"name": name, "model": spec, "device": "cpu", "rows": args.micro_batch,
                              "samples": job["samples"], "allocated": False}, env=ENV_AT_START)
        estimate = estimate_step_bytes(job)
        train_peak = measured["peak_rss"]
        out["memory"] = {"training_peak_rss_bytes": train_peak, "training_estimate_bytes": estimate,
                         "child_step_seconds": measured["two_steps_s"]}
    out["memory_estimate_ratio"] = estimate / train_peak
    free(args.device)
    return out


def estimate_step_bytes(job: dict[str, Any]) -> int:
    """The node's memory plan (swarm_node.policy.memory) of one training step on the job's batch: its
    largest micro-batch (one prompt's rows), the longest prompt and completion. CPU: the whole
    process (baseline included, as peak RSS counts it); CUDA: what torch's allocator holds."""
    from swarm_node.policy.memory import ModelShape, Precision, step_plan

    shape = ModelShape.from_config(job["model_config"])
    assert shape is not None, "a tiny Llama's config has every size"
    compute = 2 if job["compute_dtype"] in ("bfloat16", "float16") else 4
    plan = step_plan(shape, device=job["device"], micro_batch=min(job["micro_batch"], job["group_size"]),
                     prompt_tokens=max(len(s[0]) for s in job["samples"]),
                     completion_tokens=max(len(s[1]) for s in job["samples"]),
                     precision=Precision(param=4, base=4, compute=compute), baseline=job["device"] == "cpu")
    return plan.total if job["device"] == "cpu" else plan.allocated
