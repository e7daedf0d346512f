"""Does the embedded default earn reward before any training? The prompt options, measured.

    python -m benchmarks.default_task [--prompts 32] [--group-size 6] [--max-new-tokens 48] \
        [--heldout 64] [--variants plain,example] [--warmup] [--model smollm2-135m]

GRPO learns only from groups whose rewards differ. For each prompt option this samples G
completions (HF backend, temperature 1, the node's generator) for `--prompts` problems of the
default task (arithmetic level 1, the problems `select_prompts` would give) and reports:

- `mixed_groups`: share of groups whose rewards are not all equal (the groups GRPO learns from);
- `boxed`: share of completions with exactly one well-formed `\\boxed{}` (what a format reward
  would pay for: a format reward helps only when this is above 0);
- `mean_reward`: mean correctness reward of the samples;
- `heldout`: greedy pass@1 on the local held-out set (`tasks.heldout`, disjoint from the
  training set's question texts) at the same token cap.

Options: `plain` (today's instruction only), `example` (`task.worked_example`: one solved problem
shown before the question) and, with `--warmup`, `warmup` (the plain prompt on the embedded model
after the experiment harness's cached 40-step supervised warm-up; built on first use, minutes).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.common import emit, parse_args
from protocol.binding import select_prompts
from swarm_node.config import GenerationConfig, ModelConfig, TaskConfig
from swarm_node.evaluation.evaluate import evaluate
from swarm_node.policy.generation import HFGenerator
from swarm_node.policy.models import load_policy
from swarm_node.tasks.heldout import default_eval_task, disjoint_heldout
from swarm_node.tasks.prompts import render_prompt
from swarm_node.tasks.registry import load_prompt_set, make_reward_fn


def measure(model_name: str, worked_example: bool, args: argparse.Namespace) -> dict[str, Any]:
    task = TaskConfig(worked_example=worked_example)
    policy = load_policy(ModelConfig(name=model_name, dtype="float32", device="cpu"))
    prompt_set = load_prompt_set(task)
    reward = make_reward_fn(task, prompt_set.answer_kind)
    gen = HFGenerator(policy, GenerationConfig(group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                                               batch_size=32), seed=args.seed)
    indices = select_prompts("benchmark", 0, args.prompts, len(prompt_set), salt=prompt_set.id)
    problems = [prompt_set.problems[i] for i in indices]
    prompts = [render_prompt(policy.tokenizer, p.question, None, worked_example) for p in problems]
    start = time.perf_counter()
    groups = gen.generate(prompts, args.group_size)
    gen_s = time.perf_counter() - start
    mixed = boxed = total = 0
    reward_sum = 0.0
    for problem, group in zip(problems, groups, strict=True):
        scores = [reward.score(policy.tokenizer.decode(c.token_ids, skip_special_tokens=True), problem) for c in group]
        rewards = [s.reward for s in scores]
        mixed += int(len(set(rewards)) > 1)
        boxed += sum(int(s.formatted) for s in scores)
        reward_sum += sum(rewards)
        total += len(scores)
    held = disjoint_heldout(default_eval_task(task), [prompt_set], args.heldout)
    ev = evaluate(gen, policy.tokenizer, held, make_reward_fn(task, held.answer_kind, format_reward=0.0),
                  batch_size=16, max_new_tokens=args.max_new_tokens, worked_example=worked_example, progress=False)
    reward.close()
    return {"mixed_groups": round(mixed / len(groups), 3), "boxed": round(boxed / total, 3),
            "mean_reward": round(reward_sum / total, 3), "heldout": round(ev["accuracy"], 3),
            "heldout_n": ev["n"], "generate_s": round(gen_s, 1), "eval_s": round(ev["seconds"], 1),
            "mean_tokens": round(sum(len(c.token_ids) for g in groups for c in g) / total, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="the plain and example options' model")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--heldout", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="plain,example")
    ap.add_argument("--warmup", action="store_true", help="also measure the cached supervised warm-up")
    args = parse_args(ap, {"model": "tiny-random:64x2", "prompts": 2, "group_size": 2, "max_new_tokens": 8,
                           "heldout": 4})
    out: dict[str, Any] = {"benchmark": "default_task", "model": args.model, "prompts": args.prompts,
                           "group_size": args.group_size, "max_new_tokens": args.max_new_tokens, "options": {}}
    for name in args.variants.split(","):
        out["options"][name] = measure(args.model, name == "example", args)
        print(name, out["options"][name], flush=True)
    if args.warmup:
        from swarm_node.experiment.warmup import WarmupSpec, ensure_warm_model
        from swarm_node.policy.models import cache_root

        start = time.perf_counter()
        spec = WarmupSpec(base="smollm2-135m", steps=40, learning_rate=3e-5, batch_size=8)
        path = ensure_warm_model(spec, cache_root(ModelConfig()).parent / "warm")
        warm = measure(str(path), False, args)
        warm["warmup_s"] = round(time.perf_counter() - start, 1)
        out["options"]["warmup"] = warm
        print("warmup", warm, flush=True)
    emit(out)


if __name__ == "__main__":
    main()
