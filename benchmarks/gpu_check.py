"""The device check: proofs, not just a run, that a node trains on this device as a volunteer's would.

For tiny Llama shapes built in code (about 10M to 500M parameters; no hub), on `--device cuda|cpu`:

1. precision: one training step at lr 1e-6 under each precision policy; among the trained parameter
   elements whose gradient was non-zero, the fraction whose value changed (`params_changed_fraction`):
   float32, bf16 compute over float32 master weights (the default on GPUs), and, for contrast, bf16
   weights updated in place (refused by the node's config unless explicitly allowed);
2. weight sync and agreement: per (trainer compute dtype, generator dtype) pair, the gap between the
   logprobs the generator records and the ones the trainer scores (`logprob_agreement`); after a
   training step and a sync, the generator samples completions of a fixed prompt;
   the trainer scores them with the new weights and with the old ones: `sync_gap_new` and
   `sync_gap_old` are the mean |generator logprob - trainer logprob| per token. Modes: full weights, a
   model with tied embeddings, LoRA merged and LoRA adapter (the last two differ with vLLM only; with
   the HF backend the generator *is* the trained module and the fields say so);
3. resume: a checkpoint saved, loaded into freshly built policy and trainer (weights and optimizer
   state equal), one more step taken (`resume_ok`);
4. speed and memory: generation and training tokens/s, each phase's seconds, each phase's peak memory
   against the node's memory plan (`memory_estimate_ratio` = estimate / measured peak; CUDA:
   `torch.cuda.max_memory_allocated`, CPU: the peak RSS of a fresh process taking the step), and on CUDA
   an MFU estimate (6 N tokens / time / the GPU's dense bf16 peak).

Exits 1 when a proof fails (weights that did not move under bf16 compute, a sync gap to the new weights
not below a tenth of the gap to the old, a failed resume, a memory ratio outside [0.75, 1.33]); 2 when
the device is missing. It imports no network code (no hivemind, no vLLM unless `--backend vllm`), so it
runs on a GPU machine with only torch, transformers, peft and the project's small pure dependencies.
Prints one JSON object as its last line.

    python -m benchmarks.gpu_check --device cuda            # 10M, 100M, 500M shapes, ~5 min on one GPU
    python -m benchmarks.gpu_check --device cpu --quick     # 10M and 30M shapes, HF backend
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import Timer, emit, parse_args

# name -> tiny spec: hidden x layers, vocabulary padded to a real model's order of size
SHAPES = {
    "10m": "tiny-random:384x4-v8192",
    "30m": "tiny-random:512x6-v16000",
    "100m": "tiny-random:768x12-v32000",
    "500m": "tiny-random:1536x20-v32000",
}
# dense bf16 peak FLOP/s by GPU name fragment (vendor data sheets), for the MFU estimate
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12,
             "RTX 4090": 165e12, "RTX 3090": 71e12}
PRECISIONS = {  # policy -> (compute dtype, parameter dtype)
    "float32": ("float32", "float32"),
    "bf16_compute": ("bfloat16", "auto"),
    "bf16_inplace": ("bfloat16", "bfloat16"),
}
ENV_AT_START = dict(os.environ)  # for the memory children: an in-process vLLM engine edits the environment
MIN_CHANGED = 0.99
MAX_SYNC_RATIO = 0.1
RATIO_BOUNDS = (0.75, 1.33)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--shapes", default="10m,100m,500m", help=f"comma-separated, from {', '.join(SHAPES)}")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: one memory measurement in a fresh process
    args = parse_args(ap, {"shapes": "10m,30m", "prompts": 2, "group_size": 4, "max_new_tokens": 32})
    if args.child:
        print(json.dumps(measure_step_memory(json.loads(args.child))))
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False): run it on a machine with an NVIDIA "
              "GPU and a CUDA build of torch, or pass --device cpu", file=sys.stderr, flush=True)
        sys.exit(2)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        print(f"gpu_check: unknown shape(s) {unknown}: choose from {', '.join(SHAPES)}", file=sys.stderr)
        sys.exit(2)
    cache = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    result: dict[str, Any] = {"benchmark": "gpu_check", "device": args.device, "backend": args.backend,
                              "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                              "torch": torch.__version__, "lr": 1e-6, "failures": []}
    t0 = time.perf_counter()
    result["precision"] = precision_check(args, SHAPES[shapes[0]], cache)
    result["params_changed_fraction"] = {k: v["params_changed_fraction"] for k, v in result["precision"].items()}
    result["sync"] = sync_check(args, cache)
    result["logprob_agreement"] = agreement_check(args, cache)
    result["resume_ok"], result["resume"] = resume_check(args, cache)
    result["shapes"] = {name: shape_check(args, name, cache) for name in shapes}
    result["memory_estimate_ratio"] = {n: s["memory_estimate_ratio"] for n, s in result["shapes"].items()}
    result["seconds"] = time.perf_counter() - t0
    result["failures"] = failures(result)
    result["ok"] = not result["failures"]
    emit(result)
    sys.exit(0 if result["ok"] else 1)


# ---- building blocks ----------------------------------------------------------------------------


def _model_cfg(args: argparse.Namespace, spec: str, cache: Path, **kw: Any) -> Any:
    from swarm_node.config import ModelConfig

    return ModelConfig(name=spec, device=args.device, cache_dir=cache, **kw)


def _train_cfg(args: argparse.Namespace, lr: float, **kw: Any) -> Any:
    from swarm_node.config import TrainConfig

    return TrainConfig(learning_rate=lr, micro_batch_size=args.micro_batch, **kw)


def _trainer(policy: Any, train_cfg: Any) -> Any:
    from swarm_node.config import ObjectiveConfig
    from swarm_node.policy.trainer import Trainer

    return Trainer(policy, train_cfg, ObjectiveConfig(), temperature=1.0)


def _generator(args: argparse.Namespace, policy: Any, lora_sync: str = "adapter", dtype: str = "auto") -> Any:
    from swarm_node.config import GenerationConfig
    from swarm_node.policy.generation import make_generator

    cfg = GenerationConfig(backend=args.backend, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                           vllm_lora_sync=lora_sync, dtype=dtype)
    return make_generator(policy, cfg, seed=0)


def _prompts(policy: Any, n: int) -> list[list[int]]:
    """Fixed prompts of the built-in arithmetic task, rendered with the policy's chat template."""
    from swarm_node.tasks import render_prompt
    from swarm_node.tasks.arithmetic import arithmetic_prompt_set

    return [render_prompt(policy.tokenizer, p.question) for p in arithmetic_prompt_set([1], n, 0).problems]


def _samples(prompts: list[list[int]], groups: list[list[Any]], seed: int) -> list[Any]:
    """Own samples with alternating rewards, so every group has a non-zero advantage spread."""
    from swarm_node.policy.types import TrainSample

    rng = np.random.default_rng(seed)
    out = []
    for i, (p, group) in enumerate(zip(prompts, groups, strict=True)):
        rewards = rng.permutation([float(k % 2) for k in range(len(group))])
        for c, r in zip(group, rewards, strict=True):
            out.append(TrainSample(group_key=str(i), prompt_ids=np.asarray(p, dtype=np.int64),
                                   completion_ids=np.asarray(c.token_ids, dtype=np.int64),
                                   generator_logprobs=np.asarray(c.logprobs, dtype=np.float32),
                                   reward=float(r), is_peer=False))
    return out


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# ---- 1. precision -------------------------------------------------------------------------------


def precision_check(args: argparse.Namespace, spec: str, cache: Path) -> dict[str, Any]:
    """One step at lr 1e-6 per precision policy on the same samples; the changed fraction of each."""
    from swarm_node.policy.models import load_policy

    out: dict[str, Any] = {}
    samples = None
    for name, (compute, param) in PRECISIONS.items():
        policy = load_policy(_model_cfg(args, spec, cache, compute_dtype=compute, param_dtype=param))
        if samples is None:  # sampled once, from the float32 model: every policy trains on the same batch
            generator = _generator(args, policy)
            prompts = _prompts(policy, args.prompts)
            samples = _samples(prompts, generator.generate(prompts, args.group_size), seed=0)
            generator.close()
        trainer = _trainer(policy, _train_cfg(args, 1e-6))
        seen = watch_step(trainer)
        metrics = trainer.step(samples)
        changed, total = changed_elements(policy, seen)
        out[name] = {"compute_dtype": compute, "param_dtype": str(policy.dtype).removeprefix("torch."),
                     "params_changed_fraction": changed / total if total else 0.0, "elements_with_gradient": total,
                     "loss": metrics["loss"], "grad_norm": metrics["grad_norm"]}
        del policy, trainer, seen
        _free(args.device)
    return out


def watch_step(trainer: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Fills, when the trainer's optimizer steps, name -> (value before the step, gradient != 0)."""
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    names = {id(p): n for n, p in trainer.policy.trainable_parameters()}

    def before_step(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    seen[names[id(p)]] = (p.detach().clone(), p.grad != 0)

    trainer.optimizer.register_step_pre_hook(before_step)
    return seen


def changed_elements(policy: Any, seen: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> tuple[int, int]:
    """(elements with a non-zero gradient whose value changed, elements with a non-zero gradient)."""
    changed = total = 0
    for n, p in policy.trainable_parameters():
        if n in seen:
            value, live = seen[n]
            changed += int(((p.detach() != value) & live).sum())
            total += int(live.sum())
    return changed, total


# ---- 2. weight sync -----------------------------------------------------------------------------


SYNC_MODES = {  # mode -> (spec suffix, LoRA, vLLM LoRA sync, learning rate of the step)
    "full": ("", False, "adapter", 1e-4),
    "tied": ("-tied", False, "adapter", 1e-4),
    "lora_merged": ("", True, "merged", 1e-3),
    "lora_adapter": ("", True, "adapter", 1e-3),
}


def sync_check(args: argparse.Namespace, cache: Path) -> dict[str, Any]:
    """Per mode: train one step, sync, sample with the generator, score with new and old weights."""
    from swarm_node.policy.models import load_policy
    from swarm_node.policy.scoring import token_logprobs

    out: dict[str, Any] = {}
    for mode, (suffix, lora, lora_sync, lr) in SYNC_MODES.items():
        spec = "tiny-random:256x2" + suffix
        policy = load_policy(_model_cfg(args, spec, cache, lora={"enabled": lora, "rank": 8}), seed=1)
        generator = _generator(args, policy, lora_sync)
        try:
            prompts = _prompts(policy, 2)
            samples = _samples(prompts, generator.generate(prompts, args.group_size), seed=1)
            old = copy.deepcopy(policy.model)
            trainer = _trainer(policy, _train_cfg(args, lr))
            trainer.step(samples)
            generator.sync_weights(policy.model)
            fresh = generator.generate(prompts[:1], 8)[0]
            pids = [prompts[0]] * len(fresh)
            cids = [c.token_ids for c in fresh]
            gen_lp = np.concatenate([c.logprobs for c in fresh])
            with torch.no_grad():
                new_lp = torch.cat(token_logprobs(policy.model, pids, cids, 1.0, 8, compute_dtype=policy.compute_dtype))
                old_lp = torch.cat(token_logprobs(old, pids, cids, 1.0, 8, compute_dtype=policy.compute_dtype))
            gap_new = float(np.abs(gen_lp - new_lp.float().cpu().numpy()).mean())
            gap_old = float(np.abs(gen_lp - old_lp.float().cpu().numpy()).mean())
            backend = "vllm" if type(generator).__name__ == "VLLMGenerator" else "hf"
            out[mode] = {"sync_gap_new": gap_new, "sync_gap_old": gap_old, "tokens": int(len(gen_lp)),
                         "backend": backend, "lr": lr,
                         "generator": ("the trained module itself (hf backend: no copy to sync)" if backend == "hf"
                                       else f"vLLM engine, {'LoRA ' + lora_sync if lora else 'full weights'} sync")}
        finally:
            generator.close()
        del policy
        _free(args.device)
    return out


def agreement_check(args: argparse.Namespace, cache: Path) -> dict[str, Any]:
    """Per (trainer compute dtype, generator dtype) pair: the generator samples, the trainer scores the
    same tokens; the mean and largest |difference| of the sampled-token logprobs. With the HF backend
    the generator computes in the trainer's dtype, so only the matching pairs exist."""
    from swarm_node.policy.models import load_policy
    from swarm_node.policy.scoring import token_logprobs

    pairs = [("float32", "float32"), ("bfloat16", "bfloat16")]
    if args.backend == "vllm":
        pairs += [("float32", "bfloat16"), ("bfloat16", "float32")]
    out: dict[str, Any] = {}
    for compute, gen_dtype in pairs:
        policy = load_policy(_model_cfg(args, "tiny-random:256x2", cache, compute_dtype=compute))
        generator = _generator(args, policy, dtype=gen_dtype)
        try:
            prompts = _prompts(policy, 2)
            groups = generator.generate(prompts, args.group_size)
        finally:
            generator.close()
        pids = [p for p, g in zip(prompts, groups, strict=True) for _ in g]
        cids = [c.token_ids for g in groups for c in g]
        gen_lp = np.concatenate([c.logprobs for g in groups for c in g])
        with torch.no_grad():
            scored = torch.cat(token_logprobs(policy.model, pids, cids, 1.0, 8, compute_dtype=policy.compute_dtype))
        gap = np.abs(gen_lp - scored.float().cpu().numpy())
        out[f"trainer_{compute}/generator_{gen_dtype}"] = {"mean_abs": float(gap.mean()), "max_abs": float(gap.max()),
                                                           "tokens": int(gap.size)}
        del policy
        _free(args.device)
    return out


# ---- 3. resume ----------------------------------------------------------------------------------


def resume_check(args: argparse.Namespace, cache: Path) -> tuple[bool, dict[str, Any]]:
    """Save after a step, load into a freshly built policy and trainer, compare, take one more step."""
    from swarm_node.config import NodeConfig
    from swarm_node.policy.checkpoint import load_latest_checkpoint, save_checkpoint
    from swarm_node.policy.models import load_policy

    spec = "tiny-random:256x2"
    node_dir = Path(tempfile.mkdtemp(prefix="gpu-check-node-"))
    cfg = NodeConfig.model_validate({"node_dir": str(node_dir), "model": {"name": spec, "device": args.device,
                                                                          "cache_dir": str(cache)}})
    policy = load_policy(cfg.model)
    generator = _generator(args, policy)
    prompts = _prompts(policy, 2)
    samples = _samples(prompts, generator.generate(prompts, args.group_size), seed=2)
    generator.close()
    trainer = _trainer(policy, _train_cfg(args, 1e-4))
    trainer.step(samples)
    save_checkpoint(node_dir, trainer, cfg, {"step": 1})
    saved = {n: p.detach().clone() for n, p in policy.trainable_parameters()}
    moments = {k: v.clone() for k, v in trainer.optimizer.state_dict()["state"][0].items() if torch.is_tensor(v)}

    fresh = load_policy(cfg.model)
    again = _trainer(fresh, _train_cfg(args, 1e-4))
    loaded = load_latest_checkpoint(node_dir, again)
    weights_equal = all(torch.equal(p.detach(), saved[n]) for n, p in fresh.trainable_parameters())
    state = again.optimizer.state_dict()["state"].get(0, {})
    state_equal = bool(moments) and all(torch.equal(state[k], v) for k, v in moments.items())
    metrics = again.step(samples)
    moved = any(not torch.equal(p.detach(), saved[n]) for n, p in fresh.trainable_parameters())
    detail = {"loaded_step": loaded[0] if loaded else None, "weights_equal": weights_equal,
              "optimizer_state_equal": state_equal, "step_count": again.step_count,
              "next_step_finite": bool(math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])),
              "next_step_moved_weights": moved}
    ok = (loaded is not None and weights_equal and state_equal and again.step_count == 2
          and detail["next_step_finite"] and moved)
    _free(args.device)
    return ok, detail


# ---- 4. speed and memory ------------------------------------------------------------------------


def shape_check(args: argparse.Namespace, name: str, cache: Path) -> dict[str, Any]:
    """Generation and training speed of one shape at the default precision, and its memory against
    the plan (a fresh process per measurement on CPU, where peak RSS cannot be reset)."""
    from swarm_node.policy.models import load_policy

    spec = SHAPES[name]
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    policy = load_policy(_model_cfg(args, spec, cache))
    params = sum(p.numel() for p in policy.model.parameters())
    generator = _generator(args, policy)
    prompts = _prompts(policy, args.prompts)
    _sync(args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with Timer() as t_gen:
        groups = generator.generate(prompts, args.group_size)
        _sync(args.device)
    gen_peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else None
    gen_tokens = sum(len(c.token_ids) for g in groups for c in g)
    generator.close()
    samples = _samples(prompts, groups, seed=3)
    trainer = _trainer(policy, _train_cfg(args, 1e-6))
    trainer.step(samples)  # warm-up (allocator, kernels): the measured step is the second
    _sync(args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with Timer() as t_train:
        trainer.step(samples)
        _sync(args.device)
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
        estimate = estimate_step_bytes(job)
        out["memory"] = {"generation_peak_bytes": gen_peak, "training_peak_bytes": train_peak,
                         "training_estimate_bytes": estimate}
        peak_flops = next((v for k, v in PEAK_BF16.items() if k in torch.cuda.get_device_name(0)), None)
        if peak_flops:
            out["mfu"] = 6 * params * train_tokens / t_train.seconds / peak_flops
    else:
        del policy, trainer
        _free(args.device)
        measured = _child_measurement(job)
        estimate = estimate_step_bytes(job)
        train_peak = measured["peak_rss_bytes"]
        out["memory"] = {"training_peak_rss_bytes": train_peak, "training_estimate_bytes": estimate,
                         "child_step_seconds": measured["seconds"]}
    out["memory_estimate_ratio"] = estimate / train_peak
    _free(args.device)
    return out


def _child_measurement(job: dict[str, Any]) -> dict[str, Any]:
    """Run `measure_step_memory(job)` in a fresh interpreter (its peak RSS is the step's alone)."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--child", json.dumps(job)],
                          capture_output=True, text=True, check=False, env=ENV_AT_START)
    if proc.returncode != 0:
        raise RuntimeError(f"memory measurement failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_step_memory(job: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: load the shape, take one training step on the job's samples; peak RSS."""
    from benchmarks.memory_plan import peak_rss_bytes
    from swarm_node.config import ModelConfig
    from swarm_node.policy.models import load_policy
    from swarm_node.policy.types import TrainSample

    ns = argparse.Namespace(device=job["device"], micro_batch=job["micro_batch"])
    policy = load_policy(ModelConfig(name=job["spec"], device=job["device"], cache_dir=Path(job["cache"])))
    samples = [TrainSample(group_key=g, prompt_ids=np.asarray(p, dtype=np.int64),
                           completion_ids=np.asarray(c, dtype=np.int64),
                           generator_logprobs=np.asarray(lp, dtype=np.float32), reward=r, is_peer=False)
               for p, c, lp, r, g in job["samples"]]
    trainer = _trainer(policy, _train_cfg(ns, 1e-6))
    with Timer() as t:
        trainer.step(samples)
        trainer.step(samples)  # the optimizer's state exists from the first step on
    return {"peak_rss_bytes": peak_rss_bytes(), "seconds": t.seconds}


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


# ---- verdict ------------------------------------------------------------------------------------


def failures(result: dict[str, Any]) -> list[str]:
    out = []
    for name in ("float32", "bf16_compute"):
        frac = result["precision"][name]["params_changed_fraction"]
        if frac < MIN_CHANGED:
            out.append(f"precision {name}: only {frac:.4f} of the elements with a gradient changed at lr 1e-6")
    for mode, s in result["sync"].items():
        if not s["sync_gap_new"] < MAX_SYNC_RATIO * s["sync_gap_old"]:
            out.append(f"sync {mode}: gap to the new weights {s['sync_gap_new']:.3g} is not below a tenth of the "
                       f"gap to the old {s['sync_gap_old']:.3g}")
    if not result["resume_ok"]:
        out.append(f"resume failed: {result['resume']}")
    lo, hi = RATIO_BOUNDS
    for name, ratio in result["memory_estimate_ratio"].items():
        if not lo <= ratio <= hi:
            out.append(f"memory {name}: estimate / measured peak = {ratio:.2f}, outside [{lo}, {hi}]")
    return out


if __name__ == "__main__":
    main()
