"""The device check's proofs of training: weights that move under each precision policy (1), a weight
sync the generator follows and the generator-trainer logprob agreement per dtype pair (2), and a resume
into a freshly built policy and trainer (3)."""

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
    PRECISIONS, fixed_prompts, free, make_generator_for, make_trainer, model_cfg, own_samples, train_cfg,
)


def precision_check(args: argparse.Namespace, spec: str, cache: Path) -> dict[str, Any]:
    """One step at lr 1e-6 per precision policy on the same samples; the changed fraction of each."""
    from swarm_node.policy.models import load_policy

    out: dict[str, Any] = {}
    samples = None
    for name, (compute, param) in PRECISIONS.items():
        policy = load_policy(model_cfg(args, spec, cache, compute_dtype=compute, param_dtype=param))
        if samples is None:  # sampled once, from the float32 model: every policy trains on the same batch
            generator = make_generator_for(args, policy)
            prompts = fixed_prompts(policy, args.prompts)
            samples = own_samples(prompts, generator.generate(prompts, args.group_size), seed=0)
            generator.close()
        trainer = make_trainer(policy, train_cfg(args, 1e-6))
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
        policy = load_policy(model_cfg(args, spec, cache, lora={"enabled": lora, "rank": 8}), seed=1)
        generator = make_generator_for(args, policy, lora_sync)
        try:
            prompts = fixed_prompts(policy, 2)
            samples = own_samples(prompts, generator.generate(prompts, args.group_size), seed=1)
            old = copy.deepcopy(policy.model)
            trainer = make_trainer(policy, train_cfg(args, lr))
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
        free(args.device)
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
        policy = load_policy(model_cfg(args, "tiny-random:256x2", cache, compute_dtype=compute))
        generator = make_generator_for(args, policy, dtype=gen_dtype)
        try:
            prompts = fixed_prompts(policy, 2)
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
        free(args.device)
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
    generator = make_generator_for(args, policy)
    prompts = fixed_prompts(policy, 2)
    samples = own_samples(prompts, generator.generate(prompts, args.group_size), seed=2)
    generator.close()
    trainer = make_trainer(policy, train_cfg(args, 1e-4))
    trainer.step(samples)
    save_checkpoint(node_dir, trainer, cfg, {"step": 1})
    saved = {n: p.detach().clone() for n, p in policy.trainable_parameters()}
    moments = {k: v.clone() for k, v in trainer.optimizer.state_dict()["state"][0].items() if torch.is_tensor(v)}

    fresh = load_policy(cfg.model)
    again = make_trainer(fresh, train_cfg(args, 1e-4))
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
    free(args.device)
    return ok, detail
