"""One-command check that a GPU machine runs what a node does: generation with the backend this
machine would pick (`generation.backend=auto`: vLLM when installed and it starts, else HF), then
for a full-weight policy and a LoRA policy: a training step, the weight sync into the generator,
and a second generate-and-train round whose own-sample KL (`post_sync_kl_mean`) shows the generator
samples from the trained weights (near 0 when synced). bf16 where supported. `ok`: every step ran
and gave a finite loss and gradient norm.
Prints one JSON object as its last line.

    python -m benchmarks.gpu_check [--model smollm2-135m] [--backend auto|hf|vllm]

Without a CUDA device it fails at once with one line on stderr and exit code 2 (`--allow-cpu`
runs the same code on the CPU, to check the script itself; that is not a GPU check).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from benchmarks.common import Timer, emit

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backend", choices=["auto", "hf", "vllm"], default="auto")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--allow-cpu", action="store_true", help="run on the CPU (checks the script, not a GPU)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False): run it on a machine with an NVIDIA "
              "GPU and a CUDA build of torch (the `gpu` extra / Docker GPU image)", file=sys.stderr, flush=True)
        sys.exit(2)
    device = "cuda" if cuda else "cpu"
    dtype = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if cuda else "float32"
    result: dict = {"benchmark": "gpu_check", "cuda": cuda, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                    "dtype": dtype, "torch": torch.__version__}
    runs = {}
    for name, lora in (("full", False), ("lora", True)):
        runs[name] = check_policy(args, device, dtype, lora)
        if cuda:
            torch.cuda.empty_cache()
    result["backend"] = runs["full"]["backend"]
    result.update(runs)
    result["ok"] = all(r["ok"] for r in runs.values())
    emit(result)
    sys.exit(0 if result["ok"] else 1)


def check_policy(args: argparse.Namespace, device: str, dtype: str, lora: bool) -> dict:
    """Generate, train, sync, then generate and train again on one policy; the numbers of each."""
    from swarm_node.config import GenerationConfig, ModelConfig, ObjectiveConfig, TrainConfig
    from swarm_node.policy.generation import make_generator
    from swarm_node.policy.models import load_policy
    from swarm_node.policy.trainer import Trainer
    from swarm_node.tasks import render_prompt
    from swarm_node.tasks.arithmetic import arithmetic_prompt_set

    policy = load_policy(ModelConfig(name=args.model, device=device, dtype=dtype, lora={"enabled": lora, "rank": 8}))
    gen_cfg = GenerationConfig(backend=args.backend, group_size=args.group_size, max_new_tokens=args.max_new_tokens)
    generator = make_generator(policy, gen_cfg, seed=0)
    backend = "vllm" if type(generator).__name__ == "VLLMGenerator" else "hf"
    problems = arithmetic_prompt_set([1], args.prompts, 0).problems
    prompts = [render_prompt(policy.tokenizer, p.question) for p in problems]
    trainer = Trainer(policy, TrainConfig(learning_rate=1e-4 if lora else 1e-5, micro_batch_size=8),
                      ObjectiveConfig(), temperature=gen_cfg.temperature)
    out: dict = {"backend": backend, "lora": lora}
    try:
        for round_ in (1, 2):
            with Timer() as t_gen:
                groups = generator.generate(prompts, args.group_size)
            tokens = sum(len(c.token_ids) for g in groups for c in g)
            _sync_device()
            with Timer() as t_train:
                metrics = trainer.step(_samples(prompts, groups, seed=round_))
                _sync_device()
            start = time.perf_counter()
            generator.sync_weights(policy.model)
            _sync_device()
            out[f"round{round_}"] = {
                "generated_tokens": tokens, "gen_seconds": t_gen.seconds,
                "gen_tokens_per_s": tokens / t_gen.seconds if t_gen.seconds else 0.0,
                "train_seconds": t_train.seconds, "sync_seconds": time.perf_counter() - start,
                "loss": metrics["loss"], "grad_norm": metrics["grad_norm"],
                "own_sample_kl_mean": metrics.get("kl_mean"),
            }
    finally:
        generator.close()
    if device == "cuda":
        out["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    finite = all(np.isfinite(out[r][k]) for r in ("round1", "round2") for k in ("loss", "grad_norm"))
    # Round 2 samples come from the synced generator: its own-sample KL to the trainer is the
    # generator/trainer numerical gap (0 for hf; small for vLLM in bf16), not one update's worth.
    out["post_sync_kl_mean"] = out["round2"]["own_sample_kl_mean"]
    out["ok"] = bool(finite)
    return out


def _samples(prompts: list, groups: list, seed: int) -> list:
    from swarm_node.policy.types import TrainSample

    rng = np.random.default_rng(seed)
    return [TrainSample(group_key=str(i), prompt_ids=np.asarray(p, dtype=np.int64),
                        completion_ids=np.asarray(c.token_ids, dtype=np.int64),
                        generator_logprobs=np.asarray(c.logprobs, dtype=np.float32),
                        reward=float(rng.integers(0, 2)), is_peer=False)
            for i, (p, g) in enumerate(zip(prompts, groups, strict=True)) for c in g]


def _sync_device() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
