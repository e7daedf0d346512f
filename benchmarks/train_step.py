"""GRPO iterations (generate, score, update) on the embedded default model, full and LoRA, with
TRL's GRPOTrainer on the same model, prompts, G and token budget as the baseline.

    python -m benchmarks.train_step                      # full + LoRA, ours and TRL
    python -m benchmarks.train_step --mode lora --prompts 2 --group 4 --max-new-tokens 32 --no-trl

Each run (ours per mode, TRL per mode) is a fresh subprocess, so peak RSS is per run. Ours: one
warm-up iteration, then `--iterations` timed ones; per phase the median seconds of generation
(`--backend`, default hf), of the training step (forward with grad, backward, AdamW) and of the
weight sync to the generator (a no-op for hf); completion tokens/s over the
timed iterations, plus one separate no-grad scoring pass that gives the generator/trainer logprob
mismatch. TRL runs `benchmarks/trl_grpo_step.py` in its own environment (scripts/setup_trl_env.sh,
default /tmp/venv-trl) on our converted model directory with the very prompt texts we render
(`--raw-prompts`). `ours_over_trl_<mode>` = our completion tokens/s over TRL's (goal >= 2); with
`--backend vllm` LoRA runs twice, with adapter sync (`lora`, the default configuration) and with
merged-weight sync (`lora_merged`, `generation.vllm_lora_sync = "merged"`), against one TRL run;
`ours_over_trl` is the slowest mode, each mode in its faster configuration.
The prompts are the built-in word problems below, rendered with `swarm_node.tasks.render_prompt`;
the reward is 1 for a correct last \\boxed{} number, 0.5 when only the text's last number is
the answer, else 0 (the same rule in both trainers).
Last line: one JSON object (benchmarks.common.emit).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROBLEMS = [
    ("What is 7 + 5?", 12),
    ("What is 23 + 19?", 42),
    ("Tom has 9 apples and gives away 4. How many apples does he have left?", 5),
    ("A box holds 6 pens. How many pens are in 3 boxes?", 18),
    ("What is 14 - 6?", 8),
    ("What is 8 times 7?", 56),
    ("Sara reads 12 pages a day. How many pages does she read in 5 days?", 60),
    ("What is 100 divided by 4?", 25),
]
_BOXED = re.compile(r"\\boxed\s*\{([^{}]*)\}")
REPO = Path(__file__).resolve().parents[1]


def boxed_reward(text: str, answer: int) -> float:
    """1.0 for a correct last \\boxed{} number; 0.5 when only the text's last number is the answer
    (partial credit, so most groups have reward variance and the update does real work); else 0.
    The same rule as `boxed_number_reward` in benchmarks/trl_grpo_step.py."""

    def last_number_is_answer(s: str) -> bool:
        numbers = re.findall(r"-?\d+(?:\.\d+)?", s.replace(",", ""))
        return bool(numbers) and float(numbers[-1]) == answer

    boxes = _BOXED.findall(text)
    if boxes and last_number_is_answer(boxes[-1]):
        return 1.0
    return 0.5 if last_number_is_answer(text) else 0.0


def run_ours(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up plus timed iterations in this process; returns the mode's measurements."""
    import torch

    from benchmarks.common import Timer, peak_rss_mib
    from swarm_node.config import GenerationConfig, LoraConfig, ModelConfig, ObjectiveConfig, TrainConfig
    from swarm_node.policy.generation import make_generator
    from swarm_node.policy.models import load_policy
    from swarm_node.policy.trainer import Trainer
    from swarm_node.tasks import render_prompt

    if args.threads:
        torch.set_num_threads(args.threads)
    with Timer() as t_load:
        policy = load_policy(ModelConfig(name=args.model, device=args.device, dtype=args.dtype,
                                         lora=LoraConfig(enabled=mode == "lora")), seed=0)
    problems = PROBLEMS[: args.prompts]
    prompts = [render_prompt(policy.tokenizer, q) for q, _ in problems]
    generator = make_generator(policy, GenerationConfig(backend=args.backend, max_new_tokens=args.max_new_tokens,
                                                        temperature=1.0, batch_size=args.batch_size,
                                                        vllm_lora_sync=_lora_sync(args)), seed=0)
    trainer = Trainer(policy, TrainConfig(learning_rate=args.learning_rate, micro_batch_size=args.micro_batch_size),
                      ObjectiveConfig(correction="none", filter="off"), temperature=1.0)
    runs = [_iteration(policy, generator, trainer, prompts, problems, args, Timer)
            for _ in range(args.warmup + args.iterations)]
    generator.close()
    timed = runs[args.warmup:]
    tokens = sum(r["tokens"] for r in timed)
    seconds = sum(r["generate_s"] + r["train_step_s"] + r["sync_s"] for r in timed)
    return {
        "mode": mode, "load_s": t_load.seconds,
        "generate_s": statistics.median(r["generate_s"] for r in timed),
        "train_step_s": statistics.median(r["train_step_s"] for r in timed),
        "sync_s": statistics.median(r["sync_s"] for r in timed),
        "score_nograd_s": statistics.median(r["score_s"] for r in timed),
        "iteration_s": statistics.median(r["generate_s"] + r["train_step_s"] + r["sync_s"] for r in timed),
        "tokens_per_iteration": statistics.median(r["tokens"] for r in timed),
        "generate_tokens_per_s": tokens / sum(r["generate_s"] for r in timed),
        "train_tokens_per_s": tokens / sum(r["train_step_s"] for r in timed),
        "tokens_per_s": tokens / seconds,
        "logprob_mismatch_mean": statistics.fmean(r["mismatch_mean"] for r in timed),
        "logprob_mismatch_max": max(r["mismatch_max"] for r in timed),
        "reward_mean": statistics.fmean(r["reward_mean"] for r in runs),
        # Samples without gradient (advantage 0: a group whose completions all scored the same) are
        # not scored by our trainer; TRL runs them through forward and backward.
        "zero_advantage_fraction": statistics.fmean(r["skipped_fraction"] for r in timed),
        "warmup_s": sum(r["generate_s"] + r["train_step_s"] + r["sync_s"] for r in runs[: args.warmup]),
        "backend": args.backend,
        "vllm_lora_sync": _lora_sync(args) if args.backend == "vllm" and mode == "lora" else None,
        "trainable_params": sum(p.numel() for _, p in policy.trainable_parameters()),
        "peak_rss_mib": peak_rss_mib(),
        "torch_threads": torch.get_num_threads(),
    }


def _lora_sync(args: argparse.Namespace) -> str:
    return "adapter" if args.vllm_lora_sync == "both" else args.vllm_lora_sync


def _iteration(policy: Any, generator: Any, trainer: Any, prompts: list[list[int]], problems: list, args: Any,
               timer: Any) -> dict[str, float]:
    import numpy as np
    import torch

    from swarm_node.policy.scoring import token_logprobs
    from swarm_node.policy.types import TrainSample

    with timer() as t_gen:
        groups = generator.generate(prompts, n=args.group)
    decode = policy.tokenizer.decode
    samples = [
        TrainSample(f"p{i}", np.asarray(prompts[i]), c.token_ids, c.logprobs,
                    boxed_reward(decode(c.token_ids, skip_special_tokens=True), answer), False)
        for i, ((_, answer), group) in enumerate(zip(problems, groups, strict=True)) for c in group
    ]
    with timer() as t_score, torch.no_grad():
        scored = token_logprobs(policy.model, [s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                                1.0, args.micro_batch_size)
    diffs = np.concatenate([np.abs(lp.float().cpu().numpy() - s.generator_logprobs)
                            for lp, s in zip(scored, samples, strict=True)])
    with timer() as t_train:
        metrics = trainer.step(samples)
    with timer() as t_sync:
        generator.sync_weights(policy.model)
    return {"generate_s": t_gen.seconds, "train_step_s": t_train.seconds, "score_s": t_score.seconds,
            "skipped_fraction": metrics["skipped_samples"] / max(1, len(samples)),
            "sync_s": t_sync.seconds,
            "tokens": float(sum(len(s.completion_ids) for s in samples)), "reward_mean": metrics["reward_mean"],
            "mismatch_mean": float(diffs.mean()), "mismatch_max": float(diffs.max())}


def run_trl(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """TRL's iteration on the same model directory and the same rendered prompt texts."""
    from transformers import AutoTokenizer

    from swarm_node.config import ModelConfig
    from swarm_node.policy.models import EMBEDDED_NAME, cache_root, ensure_embedded_dir
    from swarm_node.tasks import render_prompt

    if args.model != EMBEDDED_NAME:
        raise ValueError("the TRL comparison runs on the embedded default model only")
    model_dir = ensure_embedded_dir(cache_root(ModelConfig()))
    tok = AutoTokenizer.from_pretrained(model_dir)
    items = [{"question": tok.decode(render_prompt(tok, q)), "answer": str(a)} for q, a in PROBLEMS[: args.prompts]]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(items, f)
    cmd = [args.trl_python, str(REPO / "benchmarks" / "trl_grpo_step.py"), "--model-dir", str(model_dir),
           "--prompts-file", f.name, "--raw-prompts", "--group-size", str(args.group),
           "--max-new-tokens", str(args.max_new_tokens), "--micro-batch-size", str(args.micro_batch_size),
           "--learning-rate", str(args.learning_rate), "--iterations", str(args.iterations)]
    cmd += ["--lora"] if mode == "lora" else []
    cmd += ["--threads", str(args.threads)] if args.threads else []
    return _run_json(cmd, f"TRL {mode}")


def _run_json(cmd: list[str], what: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - t0
    return result


def parse_args() -> argparse.Namespace:
    from benchmarks.common import parse_args as parse_with_quick

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["full", "lora", "all"], default="all")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompts", type=int, default=4, choices=range(1, len(PROBLEMS) + 1), metavar="N")
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--backend", choices=["hf", "vllm"], default="hf",
                   help="our generation backend (vllm: run this script with the vLLM environment's python)")
    p.add_argument("--vllm-lora-sync", choices=["adapter", "merged", "both"], default="both",
                   help="LoRA with --backend vllm: adapter versions, merged weights, or both (two runs)")
    p.add_argument("--batch-size", type=int, default=32, help="HF generation batch (sequences)")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=5e-6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--trl-python", default="/tmp/venv-trl/bin/python")
    p.add_argument("--no-trl", action="store_true")
    p.add_argument("--child", choices=["ours"], help=argparse.SUPPRESS)
    return parse_with_quick(p, {"model": "tiny-random:128x2", "prompts": 1, "group": 2, "max_new_tokens": 8,
                                "iterations": 1, "no_trl": True})


def main() -> None:
    args = parse_args()
    if args.child:
        print(json.dumps(run_ours(args.mode, args)))
        return
    from benchmarks.common import emit

    config = {k: v for k, v in vars(args).items() if k not in ("child", "mode")}
    out: dict[str, Any] = {"benchmark": "train_step", "config": config}
    trl_ready = not args.no_trl and Path(args.trl_python).is_file()
    if not trl_ready:
        out["trl_skipped"] = "--no-trl" if args.no_trl else f"{args.trl_python} missing: run scripts/setup_trl_env.sh"
    child = [sys.executable, "-m", "benchmarks.train_step", "--child", "ours"] + sys.argv[1:]
    for mode in (["full", "lora"] if args.mode == "all" else [args.mode]):
        runs = {mode: [*child, "--mode", mode]}
        if mode == "lora" and args.backend == "vllm":  # adapter sync unless told otherwise; merged as a variant
            syncs = ["adapter", "merged"] if args.vllm_lora_sync == "both" else [args.vllm_lora_sync]
            runs = {"lora" if sync == syncs[0] else f"lora_{sync}": [*child, "--mode", mode, "--vllm-lora-sync", sync]
                    for sync in syncs}
        for key, cmd in runs.items():
            out[key] = _run_json(cmd, f"ours {key}")
        if trl_ready:
            trl = run_trl(mode, args)
            out[f"trl_{mode}"] = trl
            for key in runs:
                out[f"ours_over_trl_{key}"] = out[key]["tokens_per_s"] / trl["tokens_per_s"]
                out[f"ours_over_trl_{key}_peak_rss"] = out[key]["peak_rss_mib"] / trl["peak_rss_mib"]
    if "full" in out and "lora" in out:
        out["lora_over_full_train_step_s"] = out["lora"]["train_step_s"] / out["full"]["train_step_s"]
        out["lora_over_full_peak_rss"] = out["lora"]["peak_rss_mib"] / out["full"]["peak_rss_mib"]
    # Headline: the slowest mode, each mode in its faster configuration (LoRA: adapter or merged sync).
    per_mode: dict[str, float] = {}
    for k, v in out.items():
        if k.startswith("ours_over_trl_") and not k.endswith("_peak_rss"):
            mode = k.removeprefix("ours_over_trl_").split("_")[0]
            per_mode[mode] = max(v, per_mode.get(mode, 0.0))
    if per_mode:
        out["ours_over_trl"] = min(per_mode.values())
    emit(out)


if __name__ == "__main__":
    main()
