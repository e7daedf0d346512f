"""Sample real rollout groups from a model and write them to a rollout file for `benchmarks.wire`.

    python -m benchmarks.collect_rollouts --out rollouts.bin [--model smollm2-135m] [--prompts 2]
    python -m benchmarks.wire --rollouts rollouts.bin

Completions carry their text and piece bytes (`swarm_node.policy.pieces`), as a node sends them
with `swarm.send_text`; a group with a completion that has no faithful text goes without text
(counted as `groups_without_text`).

Prints one JSON object as its last line (what was written).
"""

from __future__ import annotations

import argparse

from benchmarks.common import Timer, emit, parse_args
from protocol import codec
from protocol.messages import Completion, PromptRef, RolloutGroup, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--task", default="gsm8k", choices=["gsm8k", "arithmetic"])
    ap.add_argument("--source", default="../shared/data/gsm8k/test.jsonl")
    args = parse_args(ap, {"model": "tiny-random:128x2", "prompts": 2, "group_size": 2, "max_new_tokens": 8,
                           "task": "arithmetic"})

    from swarm_node.config import GenerationConfig, ModelConfig, TaskConfig
    from swarm_node.policy.generation import HFGenerator
    from swarm_node.policy.models import load_policy
    from swarm_node.policy.pieces import completion_text
    from swarm_node.tasks import load_prompt_set, render_prompt

    policy = load_policy(ModelConfig(name=args.model, device="cpu"))
    task = TaskConfig(name=args.task, source=args.source if args.task == "gsm8k" else None)
    prompt_set = load_prompt_set(task)
    gen_cfg = GenerationConfig(group_size=args.group_size, max_new_tokens=args.max_new_tokens)
    generator = HFGenerator(policy, gen_cfg, seed=0)
    problems = prompt_set.problems[: args.prompts]
    with Timer() as t:
        outputs = generator.generate([render_prompt(policy.tokenizer, p.question) for p in problems], args.group_size)
    sampling = SamplingParams(temperature=gen_cfg.temperature, top_p=gen_cfg.top_p, max_new_tokens=args.max_new_tokens)
    groups, without_text = [], 0
    for p, group in zip(problems, outputs):
        texts = [completion_text(policy.tokenizer, c.token_ids) for c in group]
        if any(t is None for t in texts):
            without_text += 1
            texts = [("", ())] * len(group)
        groups.append(RolloutGroup(
            swarm_id="bench", sender="QmBenchmarkSender", model_id=policy.model_id,
            model_revision=policy.declared_revision, adapter_digest=policy.adapter_digest,
            tokenizer_fingerprint=policy.fingerprint, policy_version=0,
            created_at=0.0, prompt=PromptRef(prompt_set_id=prompt_set.id, index=p.index, sha256=p.sha256),
            sampling=sampling,
            completions=tuple(Completion(token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason,
                                         claimed_reward=0.0, text=text, piece_bytes=pieces)
                              for c, (text, pieces) in zip(group, texts))))
    n = codec.write_rollout_file(args.out, groups)
    tokens = sum(g.num_tokens for g in groups)
    emit({"benchmark": "collect_rollouts", "model": policy.model_id, "groups": n, "tokens": tokens,
          "groups_without_text": without_text, "seconds": t.seconds, "out": args.out})


if __name__ == "__main__":
    main()
