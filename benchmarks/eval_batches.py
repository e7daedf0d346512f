"""Greedy evaluation in batches of one prompt length (`evaluate(by_length=True)`, the default) against
batches in the set's order: the grid's held-out evaluation (examples/sandbox_power_long.toml: 1,024
level-1 problems, batches of 128, 12 new tokens, one thread).

    python -m benchmarks.eval_batches                                   # tiny-random:64x2, untrained
    python -m benchmarks.eval_batches --model CACHE/warm/warm-0a55cc81c2618578   # a grid's warm model

Both orders evaluate the same model `--repeats` times, alternating, after one untimed pass each;
`speedup` = median seconds in the set's order / median by length. `identical_completions` counts
problems whose greedy completion is the same text in both orders (the batches differ only in
padding, so only floating-point summation order can change a completion). An untrained model
answers to the token limit; a warm one stops after a few tokens, where the prefill weighs more.
Last line: one JSON object (benchmarks.common.emit).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.common import emit, parse_args
from swarm_node.config import GenerationConfig, ModelConfig, TaskConfig
from swarm_node.evaluation.evaluate import evaluate
from swarm_node.policy.generation import HFGenerator
from swarm_node.policy.models import load_policy
from swarm_node.tasks import make_reward_fn
from swarm_node.tasks.arithmetic import arithmetic_prompt_set
from swarm_node.tasks.prompts import render_prompt

SYSTEM_PROMPT = "Answer in \\boxed{}."  # the sandbox files' task.system_prompt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-random:64x2", help="a model name or a saved model's directory")
    ap.add_argument("--problems", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    args = parse_args(ap, {"problems": 16, "batch_size": 8, "max_new_tokens": 4, "repeats": 1})
    torch.set_num_threads(1)
    policy = load_policy(ModelConfig(name=args.model, cache_dir=Path(tempfile.mkdtemp(prefix="bench-eval-")),
                                     device="cpu"), seed=0)
    greedy = HFGenerator(policy, GenerationConfig())
    full = arithmetic_prompt_set([1], 4000, 1000003, "standard")  # the grid's eval.task
    problems = dataclasses.replace(full, problems=full.problems[: args.problems])
    lengths = [len(render_prompt(policy.tokenizer, p.question, SYSTEM_PROMPT)) for p in problems.problems]
    reward = make_reward_fn(TaskConfig(name="arithmetic", levels=[1]), problems.answer_kind, format_reward=0.0)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    completions: dict[bool, list[str]] = {}
    try:
        for k in range(args.repeats + 1):
            for by_length in (True, False) if k % 2 == 0 else (False, True):
                r = evaluate(greedy, policy.tokenizer, problems, reward, batch_size=args.batch_size,
                             max_new_tokens=args.max_new_tokens, system_prompt=SYSTEM_PROMPT, progress=False,
                             by_length=by_length)
                completions[by_length] = [rec["completion"] for rec in r["records"]]
                if k:  # the first pass of each is untimed
                    seconds[by_length].append(r["seconds"])
                print(f"pass {k}: by_length={by_length} {r['seconds']:.2f}s accuracy {r['accuracy']:.3f}", flush=True)
    finally:
        reward.close()
    same = sum(a == b for a, b in zip(completions[True], completions[False], strict=True))
    emit({"benchmark": "eval_batches", "model": args.model, "problems": len(problems), "batch_size": args.batch_size,
          "max_new_tokens": args.max_new_tokens, "prompt_tokens": {"min": min(lengths), "median": statistics.median(lengths),
                                                                 "max": max(lengths)},
          "seconds_set_order": [round(s, 3) for s in seconds[False]],
          "seconds_by_length": [round(s, 3) for s in seconds[True]],
          "speedup": round(statistics.median(seconds[False]) / statistics.median(seconds[True]), 3),
          "identical_completions": same})


if __name__ == "__main__":
    main()
