"""A short check that generation and a training step run on a CUDA GPU with the backend this machine
has (vLLM if importable, else HF), in bf16 where supported. Prints one JSON object as its last line.

    python -m benchmarks.gpu_check [--model smollm2-135m] [--backend auto|hf|vllm] [--lora]

Without a CUDA device it says so in the JSON and exits 0, so it is safe to run anywhere.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import numpy as np
import torch

from benchmarks.common import Timer, emit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backend", choices=["auto", "hf", "vllm"], default="auto")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        emit({"benchmark": "gpu_check", "cuda": False, "ok": False, "reason": "no CUDA device"})
        return

    from swarm_node.config import GenerationConfig, ModelConfig, ObjectiveConfig, TrainConfig
    from swarm_node.policy.generation import make_generator
    from swarm_node.policy.models import load_policy
    from swarm_node.policy.trainer import Trainer
    from swarm_node.policy.types import TrainSample
    from swarm_node.tasks import render_prompt
    from swarm_node.tasks.arithmetic import arithmetic_prompt_set

    backend = args.backend
    if backend == "auto":
        backend = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    policy = load_policy(ModelConfig(name=args.model, device="cuda", dtype=dtype,
                                     lora={"enabled": args.lora}))
    gen_cfg = GenerationConfig(backend=backend, group_size=args.group_size, max_new_tokens=args.max_new_tokens)
    generator = make_generator(policy, gen_cfg, seed=0)
    problems = arithmetic_prompt_set([1], args.prompts, 0).problems
    prompts = [render_prompt(policy.tokenizer, p.question) for p in problems]

    with Timer() as t_gen:
        groups = generator.generate(prompts, args.group_size)
    tokens = sum(len(c.token_ids) for g in groups for c in g)
    rng = np.random.default_rng(0)
    samples = [TrainSample(group_key=str(i), prompt_ids=np.asarray(p, dtype=np.int64),
                           completion_ids=np.asarray(c.token_ids, dtype=np.int64),
                           generator_logprobs=np.asarray(c.logprobs, dtype=np.float32),
                           reward=float(rng.integers(0, 2)), is_peer=False)
               for i, (p, g) in enumerate(zip(prompts, groups)) for c in g]
    trainer = Trainer(policy, TrainConfig(learning_rate=1e-5, micro_batch_size=8), ObjectiveConfig(),
                      temperature=gen_cfg.temperature)
    torch.cuda.synchronize()
    with Timer() as t_train:
        metrics = trainer.step(samples)
        torch.cuda.synchronize()
    start = time.perf_counter()
    generator.sync_weights(policy.model)
    sync_s = time.perf_counter() - start
    emit({
        "benchmark": "gpu_check", "cuda": True, "ok": bool(np.isfinite(metrics["loss"])),
        "device": torch.cuda.get_device_name(0), "backend": backend, "dtype": dtype, "lora": args.lora,
        "generated_tokens": tokens, "gen_seconds": t_gen.seconds, "gen_tokens_per_s": tokens / t_gen.seconds,
        "train_seconds": t_train.seconds, "sync_seconds": sync_s, "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"], "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20,
        "own_sample_kl_mean": metrics.get("kl_mean"),  # generator vs trainer on the same weights
    })
    generator.close()


if __name__ == "__main__":
    main()
