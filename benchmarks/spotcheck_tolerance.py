"""How far honest logprobs stray from a reference recomputation: the spot-check tolerance.

    python -m benchmarks.spotcheck_tolerance --model tiny-random:128x2 --groups 300
    python -m benchmarks.spotcheck_tolerance --model smollm2-135m --groups 24 --backend hf

Honest groups are sampled by the node's own generator (`--backend hf`: HFGenerator; `vllm`: the
vLLM backend, which needs vLLM installed) with the model in each `--gen-dtype`, then checked as a
receiver does (`swarm_node.peers.spotcheck`: `--positions` positions of `--completions` completions, at
the group's declared temperature) by the same model loaded in each `--score-dtype`. Reports, per
(model, generation dtype, scoring dtype), the distribution of the per-group median exp(|delta|) - 1
(median, p99, max), how many groups exceed `--tolerance` (honest false positives), and how many
forged copies of the same groups the same check catches (`forged_detected`: logprobs lowered by
log 2 = log C, the most a forger gains, and by log 1.5; set to 0; set to the floor -50).

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import random

import numpy as np

from benchmarks.common import Timer, emit, parse_args
from protocol.messages import Completion, PromptRef, RolloutGroup, SamplingParams


def _groups(policy, generator, problems, render, group_size, temperature, max_new) -> list[tuple]:
    prompts = [render(policy.tokenizer, p) for p in problems]
    out = generator.generate(prompts, group_size)
    groups = []
    for p, prompt, comps in zip(problems, prompts, out, strict=True):
        groups.append((p, prompt, RolloutGroup(
            swarm_id="bench", sender="QmBench", model_id=policy.model_id, model_revision=policy.declared_revision,
            tokenizer_fingerprint=policy.fingerprint, policy_version=0, created_at=0.0,
            prompt=PromptRef(prompt_set_id="bench", index=p.index, sha256=p.sha256),
            sampling=SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=max_new),
            completions=tuple(Completion(token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason,
                                         claimed_reward=0.0) for c in comps))))
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=None, help="repeatable (default tiny-random:128x2)")
    ap.add_argument("--groups", type=int, default=300)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--gen-dtype", default="float32,bfloat16")
    ap.add_argument("--score-dtype", default="float32,bfloat16")
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--completions", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=None, help="default: swarm.spot_check.tolerance")
    ap.add_argument("--task", default="arithmetic", choices=["gsm8k", "arithmetic"])
    ap.add_argument("--source", default="../shared/data/gsm8k/test.jsonl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warm-steps", type=int, default=0,
                    help="warm tiny-random models first (swarm_node.experiment.warmup, level-1 arithmetic): sharper "
                         "distributions than random ones")
    ap.add_argument("--cache", default=None, help="where warmed models are kept (default: a temporary directory)")
    args = parse_args(ap, {"groups": 2, "group_size": 2, "max_new_tokens": 8})

    import torch

    torch.set_num_threads(1)
    from swarm_node.config import GenerationConfig, ModelConfig, TaskConfig
    from swarm_node.config.spotcheck import DEFAULT_TOLERANCE
    from swarm_node.policy.generation import make_generator
    from swarm_node.policy.models import load_policy
    from swarm_node.peers.spotcheck import mismatch, recompute, sample_positions
    from swarm_node.tasks import load_prompt_set, render_prompt

    tolerance = args.tolerance if args.tolerance is not None else DEFAULT_TOLERANCE
    task = TaskConfig(name=args.task, source=args.source if args.task == "gsm8k" else None)
    prompt_set = load_prompt_set(task)
    problems = [prompt_set.problems[i % len(prompt_set)] for i in range(args.groups)]

    def render(tok, p):
        return render_prompt(tok, p.question, task.system_prompt, task.worked_example)

    models = args.model or ["tiny-random:128x2"]
    if args.warm_steps:
        import tempfile
        from pathlib import Path

        from swarm_node.experiment.warmup import WarmupSpec, ensure_warm_model

        cache = Path(args.cache or tempfile.mkdtemp(prefix="spotcheck-warm-"))
        models = [str(ensure_warm_model(WarmupSpec(base=m, levels=(1,), steps=args.warm_steps), cache, log=lambda _: None))
                  if m.startswith("tiny-random:") else m for m in models]
    results, all_values = [], []
    with Timer() as total:
        for model in models:
            for gen_dtype in args.gen_dtype.split(","):
                gen_policy = load_policy(ModelConfig(name=model, device="cpu", dtype=gen_dtype))
                gen_cfg = GenerationConfig(group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                                           temperature=args.temperature, backend=args.backend, batch_size=16)
                generator = make_generator(gen_policy, gen_cfg, seed=args.seed)
                with Timer() as t_gen:
                    groups = []
                    for start in range(0, len(problems), 8):
                        groups += _groups(gen_policy, generator, problems[start:start + 8], render, args.group_size,
                                          args.temperature, args.max_new_tokens)
                generator.close()
                del gen_policy
                for score_dtype in args.score_dtype.split(","):
                    ref = load_policy(ModelConfig(name=model, device="cpu", dtype=score_dtype))
                    rng = random.Random(args.seed)
                    values, forged = [], {"amplify_c": 0, "amplify_1.5": 0, "zero": 0, "floor": 0}
                    with Timer() as t_score:
                        for _p, prompt, g in groups:
                            picked = sample_positions([len(c.token_ids) for c in g.completions], len(prompt),
                                                      args.positions, args.completions, 1 << 30, rng)
                            declared, ours = recompute(ref.model, prompt, g, picked, ref.compute_dtype)
                            values.append(mismatch(declared, ours))
                            d = np.asarray(declared)  # the same positions, forged: detected when over the tolerance
                            for kind, fake in (("amplify_c", d - np.log(2.0)), ("amplify_1.5", d - np.log(1.5)),
                                               ("zero", np.zeros_like(d)), ("floor", np.full_like(d, -50.0))):
                                forged[kind] += int(mismatch(fake, ours) > tolerance)
                    v = np.asarray(values)
                    all_values += values
                    results.append({
                        "model": model, "gen_dtype": gen_dtype, "score_dtype": score_dtype, "groups": len(v),
                        "median": float(np.median(v)), "p99": float(np.quantile(v, 0.99)), "max": float(v.max()),
                        "false_positives": int((v > tolerance).sum()), "forged_detected": forged,
                        "gen_seconds": t_gen.seconds,
                        "score_seconds": t_score.seconds})
                    print(results[-1], flush=True)
    worst = max(r["max"] for r in results)
    emit({"benchmark": "spotcheck_tolerance", "backend": args.backend, "temperature": args.temperature,
          "positions": args.positions, "completions": args.completions, "tolerance": tolerance,
          "groups_checked": len(all_values), "false_positives": int(sum(r["false_positives"] for r in results)),
          "worst_group": worst, "margin": tolerance / worst if worst > 0 else None, "runs": results,
          "seconds": total.seconds})


if __name__ == "__main__":
    main()
