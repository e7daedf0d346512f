"""The device check's proofs of training: weights that move under each precision policy (1), a weight
sync the generator follows at the examples' learning rates and the generator-trainer logprob agreement
per dtype pair at a temperature below 1 (2), and a resume into a freshly built policy and trainer (3).
Each returns what it measured; `benchmarks.gpu_check.verdict` judges it."""

from __future__ import annotations

import argparse
import copy
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.gpu_check.parts import (
    NODE, PRECISIONS, Build, GenSettings, fixed_prompts, free, generates_with, model_cfg, own_samples, train_cfg,
)

PRECISION_LR = 1e-6


def precision_check(args: argparse.Namespace, spec: str, cache: Path, node: Build = NODE) -> dict[str, Any]:
    """One step at lr 1e-6 per precision policy on the same samples; the changed fraction of each."""
    out: dict[str, Any] = {}
    samples = None
    for name, (compute, param) in PRECISIONS.items():
        policy = node.policy(model_cfg(args, spec, cache, compute_dtype=compute, param_dtype=param), 0)
        if samples is None:  # sampled once, from the float32 model: every policy trains on the same batch
            generator = node.generator(args, policy, GenSettings())
            prompts = fixed_prompts(policy, args.prompts)
            samples = own_samples(prompts, generator.generate(prompts, args.group_size), seed=0)
            generator.close()
        trainer = node.trainer(policy, train_cfg(args, PRECISION_LR), 1.0)
        seen = watch_step(trainer)
        metrics = trainer.step(samples)
        changed, total = changed_elements(policy, seen)
        out[name] = {"compute_dtype": compute, "param_dtype": str(policy.dtype).removeprefix("torch."),
                     "params_changed_fraction": changed / total if total else 0.0, "elements_with_gradient": total,
                     "loss": metrics["loss"], "grad_norm": metrics["grad_norm"]}
        del policy, trainer, seen
        free(args.device)
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


# ---- 2. weight sync and agreement ---------------------------------------------------------------

# mode -> (spec suffix, LoRA, vLLM LoRA sync, learning rate): the rates examples/paper_gpu_replication
# uses on GPUs (full fine-tuning 1e-6, the paper's; LoRA 1e-5)
SYNC_MODES = {
    "full": ("", False, "adapter", 1e-6),
    "tied": ("-tied", False, "adapter", 1e-6),
    "lora_merged": ("", True, "merged", 1e-5),
    "lora_adapter": ("", True, "adapter", 1e-5),
}
SYNC_STEPS = 3  # steps at the mode's rate, each followed by a sync, before the generator is read
SYNC_SPEC = "tiny-random:256x2"


def sync_check(args: argparse.Namespace, cache: Path, node: Build = NODE,
               modes: tuple[str, ...] = tuple(SYNC_MODES)) -> dict[str, Any]:
    """Per mode: SYNC_STEPS steps at the mode's learning rate, each followed by a sync; then the
    generator samples a fixed prompt and the trainer scores those tokens with the new and the old
    weights (mean |generator - trainer| per token: `sync_gap_new`, `sync_gap_old`). Trainer and
    generator run in float32, so the gap to the new weights is float32 noise (about 1e-6) and a
    few steps' change at these small rates stands out. A generator that samples with the trained
    module itself (hf) has nothing to sync: `applicable` is false and the verdict says so."""
    from swarm_node.policy.scoring import token_logprobs

    out: dict[str, Any] = {}
    for mode in modes:
        suffix, lora, lora_sync, lr = SYNC_MODES[mode]
        policy = node.policy(model_cfg(args, SYNC_SPEC + suffix, cache, compute_dtype="float32",
                                       lora={"enabled": lora, "rank": 8}), 1)
        generator = node.generator(args, policy, GenSettings(lora_sync=lora_sync, dtype="float32"))
        try:
            prompts = fixed_prompts(policy, 2)
            old = copy.deepcopy(policy.model)
            trainer = node.trainer(policy, train_cfg(args, lr), 1.0)
            for step in range(SYNC_STEPS):
                trainer.step(own_samples(prompts, generator.generate(prompts, args.group_size), seed=10 + step))
                generator.sync_weights(policy.model)
            fresh = generator.generate(prompts[:1], 8)[0]
            pids = [prompts[0]] * len(fresh)
            cids = [c.token_ids for c in fresh]
            gen_lp = np.concatenate([c.logprobs for c in fresh])
            with torch.no_grad():
                new_lp = torch.cat(token_logprobs(policy.model, pids, cids, 1.0, 8))
                old_lp = torch.cat(token_logprobs(old, pids, cids, 1.0, 8))
            applicable = not generates_with(generator, policy)
            out[mode] = {"sync_gap_new": float(np.abs(gen_lp - new_lp.float().cpu().numpy()).mean()),
                         "sync_gap_old": float(np.abs(gen_lp - old_lp.float().cpu().numpy()).mean()),
                         "tokens": int(len(gen_lp)), "lr": lr, "steps": SYNC_STEPS, "applicable": applicable,
                         "generator": (f"{type(generator).__name__}, {'LoRA ' + lora_sync if lora else 'full weights'}"
                                       " sync" if applicable else
                                       "the trained module itself (hf backend): no weights to sync, not applicable")}
        finally:
            generator.close()
        del policy, old
        free(args.device)
    return out


AGREEMENT_TEMPERATURE = 0.7  # below 1: a generator reporting untempered logprobs disagrees by ~0.27 per token
AGREEMENT_SPEC = "tiny-random:256x2"


def agreement_pairs(backend: str) -> list[tuple[str, str]]:
    """(trainer compute dtype, generator dtype) pairs: hf generates in the trainer's own dtype."""
    pairs = [("float32", "float32"), ("bfloat16", "bfloat16")]
    return pairs + ([("float32", "bfloat16"), ("bfloat16", "float32")] if backend == "vllm" else [])


def agreement_check(args: argparse.Namespace, cache: Path, node: Build = NODE) -> dict[str, Any]:
    """Per (trainer compute dtype, generator dtype) pair: the generator samples at
    AGREEMENT_TEMPERATURE, the trainer scores the same tokens at it; the mean and largest |difference|
    of the sampled-token logprobs (judged per pair: verdict.AGREEMENT_BOUNDS)."""
    from swarm_node.policy.scoring import token_logprobs

    out: dict[str, Any] = {}
    for compute, gen_dtype in agreement_pairs(args.backend):
        policy = node.policy(model_cfg(args, AGREEMENT_SPEC, cache, compute_dtype=compute), 0)
        generator = node.generator(args, policy, GenSettings(dtype=gen_dtype, temperature=AGREEMENT_TEMPERATURE))
        try:
            prompts = fixed_prompts(policy, 2)
            groups = generator.generate(prompts, args.group_size)
        finally:
            generator.close()
        pids = [p for p, g in zip(prompts, groups, strict=True) for _ in g]
        cids = [c.token_ids for g in groups for c in g]
        gen_lp = np.concatenate([c.logprobs for g in groups for c in g])
        with torch.no_grad():
            scored = torch.cat(token_logprobs(policy.model, pids, cids, AGREEMENT_TEMPERATURE, 8,
                                              compute_dtype=policy.compute_dtype))
        gap = np.abs(gen_lp - scored.float().cpu().numpy())
        out[f"trainer_{compute}/generator_{gen_dtype}"] = {
            "trainer_dtype": compute, "generator_dtype": gen_dtype, "temperature": AGREEMENT_TEMPERATURE,
            "mean_abs": float(gap.mean()), "max_abs": float(gap.max()), "tokens": int(gap.size)}
        del policy
        free(args.device)
    return out


# ---- 3. resume ----------------------------------------------------------------------------------


def resume_check(args: argparse.Namespace, cache: Path, node: Build = NODE) -> tuple[bool, dict[str, Any]]:
    """Save after a step, load into a freshly built policy and trainer, compare (on the CPU: the
    moments live on the parameters' device, a plain AdamW's step counters on the CPU), check each
    counter is where the first trainer's fresh optimizer put it, take one more step."""
    from swarm_node.config import NodeConfig
    from swarm_node.policy.checkpoint import save_checkpoint

    spec = "tiny-random:256x2"
    node_dir = Path(tempfile.mkdtemp(prefix="gpu-check-node-"))
    cfg = NodeConfig.model_validate({"node_dir": str(node_dir), "model": {"name": spec, "device": args.device,
                                                                          "cache_dir": str(cache)}})
    policy = node.policy(cfg.model, 0)
    generator = node.generator(args, policy, GenSettings())
    prompts = fixed_prompts(policy, 2)
    samples = own_samples(prompts, generator.generate(prompts, args.group_size), seed=2)
    generator.close()
    trainer = node.trainer(policy, train_cfg(args, 1e-4), 1.0)
    trainer.step(samples)
    save_checkpoint(node_dir, trainer, cfg, {"step": 1})
    saved = {n: p.detach().cpu().clone() for n, p in policy.trainable_parameters()}
    state = optimizer_state(trainer.optimizer)
    expected_devices = {k: v.device for k, v in state.items()}
    saved_state = {k: v.cpu().clone() for k, v in state.items()}

    fresh = node.policy(cfg.model, 0)
    again = node.trainer(fresh, train_cfg(args, 1e-4), 1.0)
    loaded = node.resume(node_dir, again)
    weights_equal = all(torch.equal(p.detach().cpu(), saved[n]) for n, p in fresh.trainable_parameters())
    restored = optimizer_state(again.optimizer)
    state_equal = set(restored) == set(saved_state) and all(
        torch.equal(restored[k].cpu(), v) for k, v in saved_state.items())
    misplaced = sorted(k for k, v in restored.items() if v.device != expected_devices.get(k))
    metrics = again.step(samples)
    moved = any(not torch.equal(p.detach().cpu(), saved[n]) for n, p in fresh.trainable_parameters())
    detail = {"loaded_step": loaded[0] if loaded else None, "weights_equal": weights_equal,
              "optimizer_state_equal": state_equal, "optimizer_tensors": len(saved_state),
              "optimizer_state_misplaced": misplaced[:6], "step_count": again.step_count,
              "next_step_finite": bool(math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])),
              "next_step_moved_weights": moved}
    ok = (loaded is not None and weights_equal and state_equal and not misplaced and again.step_count == 2
          and detail["next_step_finite"] and moved)
    del policy, fresh, trainer, again
    free(args.device)
    return ok, detail


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every tensor of the optimizer's state, named '<parameter index>.<key>' (moments and step counters)."""
    out: dict[str, torch.Tensor] = {}
    for index, per_param in optimizer.state_dict()["state"].items():
        for key, value in per_param.items():
            if torch.is_tensor(value):
                out[f"{index}.{key}"] = value
    return out
