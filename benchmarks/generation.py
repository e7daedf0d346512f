"""Generation throughput and logprob agreement of the `hf` and `vllm` backends.

    python -m benchmarks.generation [--prompts 4] [--group-size 8] [--max-new-tokens 256]

On the embedded default model (SmolLM2-135M-Instruct, float32, CPU unless a GPU is present) each
backend generates prompts x G completions twice in the same run: through our generator
(HFGenerator / VLLMGenerator) and through the raw engine call (transformers `generate` /
`vllm.LLM.generate` with the same sampling settings), so `wrapper_overhead` = our seconds per
token / raw seconds per token. Completions that stop early make the token counts differ between
the two runs; throughput is therefore compared per generated token. The mismatch between each
generator's reported logprobs and the trainer's scoring (`scoring.token_logprobs`, same weights,
same temperature) is reported as mean and max absolute difference over all sampled tokens.

vLLM runs only in the vllm environment (scripts/setup_vllm_env.sh); elsewhere its section reads
`{"available": false, ...}` and the hf numbers are still measured. The hf backend runs first
because vLLM's in-process CPU engine pins torch to one thread for the rest of the process.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from benchmarks.common import Timer, emit, parse_args, peak_rss_mib
from swarm_node.config import GenerationConfig, ModelConfig
from swarm_node.policy.generation import HFGenerator
from swarm_node.policy.models import Policy, load_policy
from swarm_node.policy.scoring import token_logprobs
from swarm_node.policy.types import GeneratedCompletion
from swarm_node.tasks.prompts import render_prompt

QUESTIONS = (
    "Tom has 7 apples and buys 5 more. How many apples does he have now?",
    "A box holds 12 pencils. How many pencils are in 3 boxes?",
    "Sara had 40 stickers and gave away 15. How many stickers does she have left?",
    "A train travels 60 km each hour. How far does it travel in 4 hours?",
    "There are 9 birds on a tree and 6 fly away. How many birds are left?",
    "Each of 5 friends has 8 marbles. How many marbles do they have together?",
    "A shop sold 23 cakes in the morning and 19 in the afternoon. How many cakes did it sell?",
    "Ben reads 14 pages a day. How many pages does he read in 6 days?",
)


def logprob_mismatch(policy: Policy, prompts: Sequence[Sequence[int]],
                     groups: Sequence[Sequence[GeneratedCompletion]], temperature: float) -> dict[str, float]:
    """Mean and max |generator logprob - trainer logprob| over every sampled token."""
    flat_prompts = [list(p) for p, group in zip(prompts, groups) for _ in group]
    flat = [c for group in groups for c in group]
    with torch.no_grad():
        trainer = token_logprobs(policy.model, flat_prompts, [c.token_ids.tolist() for c in flat], temperature, 8)
    diffs = np.concatenate([np.abs(t.float().cpu().numpy() - c.logprobs) for t, c in zip(trainer, flat)])
    return {"mean_abs": float(diffs.mean()), "max_abs": float(diffs.max()), "tokens": int(diffs.size)}


def summarize(seconds: float, tokens: int) -> dict[str, float]:
    return {"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 2)}


def completion_tokens(groups: Sequence[Sequence[GeneratedCompletion]]) -> int:
    return sum(len(c.token_ids) for group in groups for c in group)


def raw_hf_generate(policy: Policy, prompts: Sequence[Sequence[int]], cfg: GenerationConfig, n: int) -> int:
    """Plain transformers sampling of n completions per prompt in one batch; returns tokens generated."""
    stops = torch.tensor(policy.stop_token_ids)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), policy.pad_token_id, dtype=torch.long)  # [P, W] left-padded
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p))
        mask[i, width - len(p):] = 1
    with torch.no_grad():
        out = policy.model.generate(
            input_ids=ids.to(policy.device), attention_mask=mask.to(policy.device), do_sample=True,
            temperature=cfg.temperature, top_p=cfg.top_p, top_k=0, max_new_tokens=cfg.max_new_tokens,
            num_return_sequences=n, eos_token_id=policy.stop_token_ids, pad_token_id=policy.pad_token_id,
        )[:, width:].cpu()  # [P * n, steps]
    total = 0
    for row in out:
        hit = torch.isin(row, stops).nonzero()
        total += int(hit[0, 0]) + 1 if len(hit) else len(row)
    return total


def bench_hf(policy: Policy, prompts: list[list[int]], cfg: GenerationConfig, n: int, seed: int) -> dict[str, Any]:
    gen = HFGenerator(policy, cfg.model_copy(update={"batch_size": len(prompts) * n}), seed=seed)
    torch.manual_seed(seed)
    raw_hf_generate(policy, prompts[:1], cfg.model_copy(update={"max_new_tokens": 4}), 1)  # warm-up
    with Timer() as t_ours:
        groups = gen.generate(prompts, n)
    with Timer() as t_raw:
        raw_tokens = raw_hf_generate(policy, prompts, cfg, n)
    ours = summarize(t_ours.seconds, completion_tokens(groups))
    raw = summarize(t_raw.seconds, raw_tokens)
    return {"available": True, "ours": ours, "raw": raw,
            "wrapper_overhead": round(raw["tokens_per_s"] / ours["tokens_per_s"], 3),
            "logprob_mismatch": logprob_mismatch(policy, prompts, groups, cfg.temperature),
            "finish_reasons": finish_counts(groups)}


def bench_vllm(policy: Policy, prompts: list[list[int]], cfg: GenerationConfig, n: int, seed: int) -> dict[str, Any]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as e:
        return {"available": False, "reason": f"vllm not importable ({e}); run in the vllm environment"}
    from swarm_node.policy.vllm_generator import VLLMGenerator

    with Timer() as t_start:
        gen = VLLMGenerator(policy, cfg, seed=seed)
    try:
        warm = vllm.SamplingParams(n=1, max_tokens=4, temperature=cfg.temperature)
        gen.llm.generate([vllm.TokensPrompt(prompt_token_ids=prompts[0])], warm, use_tqdm=False)
        with Timer() as t_ours:
            groups = gen.generate(prompts, n)
        params = vllm.SamplingParams(n=n, temperature=cfg.temperature, top_p=cfg.top_p,
                                     max_tokens=cfg.max_new_tokens, logprobs=0)
        with Timer() as t_raw:
            outs = gen.llm.generate([vllm.TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                    use_tqdm=False)
        raw_tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        with Timer() as t_sync:
            gen.sync_weights(policy.model)
    finally:
        gen.close()
    ours = summarize(t_ours.seconds, completion_tokens(groups))
    raw = summarize(t_raw.seconds, raw_tokens)
    return {"available": True, "version": vllm.__version__, "engine_start_s": round(t_start.seconds, 2),
            "weight_sync_s": round(t_sync.seconds, 3), "ours": ours, "raw": raw,
            "wrapper_overhead": round(raw["tokens_per_s"] / ours["tokens_per_s"], 3),
            "logprob_mismatch": logprob_mismatch(policy, prompts, groups, cfg.temperature),
            "finish_reasons": finish_counts(groups)}


def finish_counts(groups: Sequence[Sequence[GeneratedCompletion]]) -> dict[str, int]:
    reasons = [c.finish_reason for group in groups for c in group]
    return {r: reasons.count(r) for r in ("stop", "length")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--backends", default="hf,vllm", help="comma-separated subset of hf,vllm")
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, {"model": "tiny-random:128x2", "prompts": 1, "group_size": 2, "max_new_tokens": 8})
    if not 1 <= args.prompts <= len(QUESTIONS):
        parser.error(f"--prompts must be in [1, {len(QUESTIONS)}]")
    policy = load_policy(ModelConfig(name=args.model, dtype="float32"), seed=args.seed)
    prompts = [render_prompt(policy.tokenizer, q) for q in QUESTIONS[: args.prompts]]
    cfg = GenerationConfig(group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature)
    backends = args.backends.split(",")
    result: dict[str, Any] = {
        "benchmark": "generation",
        "model": policy.model_id, "device": str(policy.device),
        "prompts": args.prompts, "group_size": args.group_size, "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
    }
    for name, bench in (("hf", bench_hf), ("vllm", bench_vllm)):
        result[name] = (bench(policy, prompts, cfg, args.group_size, args.seed) if name in backends
                        else {"available": False, "reason": "not selected (--backends)"})
    if result["hf"]["available"] and result["vllm"]["available"]:
        result["vllm_over_hf_tokens_per_s"] = round(
            result["vllm"]["ours"]["tokens_per_s"] / result["hf"]["ours"]["tokens_per_s"], 3)
    result["peak_rss_mib"] = round(peak_rss_mib(), 1)
    emit(result)


if __name__ == "__main__":
    main()
