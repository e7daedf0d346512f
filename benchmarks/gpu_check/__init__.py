"""The device check: proofs, not just a run, that a node trains on this device as a volunteer's would.

For tiny Llama shapes built in code (about 10M to 500M parameters, and one with Qwen2.5's grouping of
7 query heads per key/value head and its 152k vocabulary at small width; no hub), on `--device cuda|cpu`:

1. precision: one training step at lr 1e-6 under each precision policy; among the trained parameter
   elements whose gradient was non-zero, the fraction whose value changed (`params_changed_fraction`):
   float32, bf16 compute over float32 master weights (the default on GPUs), and, for contrast, bf16
   weights updated in place (refused by the node's config unless explicitly allowed);
2. weight sync and agreement: after 3 steps at the learning rates the GPU examples use (full 1e-6,
   LoRA 1e-5), each followed by a sync, the generator samples completions of a fixed prompt and the
   trainer scores them with the new weights and with the old ones: `sync_gap_new` and `sync_gap_old`
   are the mean |generator logprob - trainer logprob| per token (float32 on both sides). Modes: full
   weights, a model with tied embeddings, LoRA merged and LoRA adapter. With the hf backend the
   generator *is* the trained module: those modes are "not applicable" (they neither pass nor fail).
   Per (trainer compute dtype, generator dtype) pair, the generator samples at temperature 0.7 and
   the trainer scores at it (`logprob_agreement`, judged against a bound per pair);
3. resume: a checkpoint saved, loaded into freshly built policy and trainer (weights and optimizer
   state equal, compared on the CPU; each optimizer tensor on the device the saved trainer's
   optimizer kept it on), one more step taken (`resume_ok`);
4. speed and memory: generation and training tokens/s, each phase's seconds, each phase's peak memory
   against the node's memory plan (`memory_estimate_ratio` = estimate / measured peak; CUDA:
   `torch.cuda.max_memory_allocated` after the generator is closed and its memory collected, CPU: the
   peak RSS of a fresh process taking the step), on CUDA the allocator's reserve and the memory outside
   torch (the plan's stated CUDA constants, measured) and an MFU estimate (6 N tokens / time / the
   GPU's dense bf16 peak).

Bounds: `benchmarks.gpu_check.verdict`. Exits 1 when a proof fails, 2 when the device is missing. It
imports no network code (no hivemind, no vLLM unless `--backend vllm`), so it runs on a GPU machine with
only torch, transformers, peft and the project's small pure dependencies (scripts/device_check.sh
carries them there). Prints one JSON object as its last line.

    python -m benchmarks.gpu_check --device cuda            # 10M, 100M, 500M and GQA shapes (not yet run on a GPU)
    python -m benchmarks.gpu_check --device cpu --quick     # 10M, 30M and GQA shapes at small sizes, HF backend
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import emit, parse_args
from benchmarks.gpu_check.parts import SHAPES
from benchmarks.gpu_check.proofs import agreement_check, precision_check, resume_check, sync_check
from benchmarks.gpu_check.speed import shape_check
from benchmarks.gpu_check.verdict import NOT_APPLICABLE, agreement_bound, failures, sync_verdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--shapes", default="10m,100m,500m,gqa7-152k", help=f"comma-separated, from {', '.join(SHAPES)}")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=8)
    args = parse_args(ap, {"shapes": "10m,30m,gqa7-152k", "prompts": 2, "group_size": 4, "max_new_tokens": 32})
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
    for s in result["sync"].values():
        s["verdict"] = sync_verdict(s)
    result["sync_not_applicable"] = sorted(m for m, s in result["sync"].items() if s["verdict"] == NOT_APPLICABLE)
    result["logprob_agreement"] = agreement_check(args, cache)
    for e in result["logprob_agreement"].values():
        e["bound"] = agreement_bound(e)
    result["resume_ok"], result["resume"] = resume_check(args, cache)
    result["shapes"] = {name: shape_check(args, name, cache) for name in shapes}
    result["memory_estimate_ratio"] = {n: s["memory_estimate_ratio"] for n, s in result["shapes"].items()}
    result["seconds"] = time.perf_counter() - t0
    result["failures"] = failures(result)
    result["ok"] = not result["failures"]
    emit(result)
    sys.exit(0 if result["ok"] else 1)
