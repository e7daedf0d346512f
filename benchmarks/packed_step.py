"""One F-TIS training step and one generation round at the power sandbox's shape, one prompt per
micro-batch against several prompts packed into one (`train.pack_prompts`), and generation with
every row prefilled against each distinct prompt prefilled once (`HFGenerator(share_prompts=...)`),
in batches of 64 and 128.

    python -m benchmarks.packed_step                       # tiny-random:64x2, 16 prompts x G = 8, 16 peer groups
    python -m benchmarks.packed_step --model smollm2-135m --peer-model smollm2-135m --prompts 4 --group 4 \
        --max-new-tokens 32 --micro-batch-size 8 --pack-size 16

The shape is examples/sandbox_power_long.toml's: arithmetic prompts rendered as that file renders
them, own groups from the node's model and as many peer groups from another model (`--peer-model`:
other weights, the same tokenizer), rewards drawn at random (about half correct) so that F-TIS
filters some peer samples and diagnoses them in a no-grad pass, as in the grid. Each configuration runs `--repeats`
steps on a fresh copy of the weights after one untimed step; the median seconds are reported, and
`train_speedup` = one-prompt median / packed median (the same run, the same samples);
`gen_speedup_shared_prefill` = every row prefilled / each prompt once (batches of 64);
`gen_speedup_batch128` = batches of 64 / of 128 (both prefilling each prompt once). The untrained
model answers to the token limit; a trained one stops earlier, which favours smaller batches.
Last line: one JSON object (benchmarks.common.emit).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import emit, parse_args
from swarm_node.config import GenerationConfig, ModelConfig, ObjectiveConfig, TrainConfig
from swarm_node.policy.generation import HFGenerator
from swarm_node.policy.models import load_policy
from swarm_node.policy.trainer import Trainer
from swarm_node.policy.types import TrainSample
from swarm_node.tasks.prompts import render_prompt


def _samples(policy, generator, prompts, group: int, source: str, rng: random.Random) -> list[TrainSample]:
    groups = generator.generate(prompts, n=group)
    return [TrainSample(group_key=f"{source}-{g}", prompt_ids=np.asarray(prompts[g]), completion_ids=c.token_ids,
                        generator_logprobs=c.logprobs, reward=float(rng.random() < 0.5), is_peer=source != "self",
                        source=source)
            for g, completions in enumerate(groups) for c in completions]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-random:64x2")
    ap.add_argument("--peer-model", default="tiny-random:64x2:a:1", help="the peer: same tokenizer, other weights")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--micro-batch-size", type=int, default=16, help="one-prompt arm (the sandbox file's)")
    ap.add_argument("--pack-size", type=int, default=128, help="packed arm's micro_batch_size")
    ap.add_argument("--repeats", type=int, default=5)
    args = parse_args(ap, {"prompts": 2, "group": 2, "max_new_tokens": 4, "repeats": 1})
    torch.set_num_threads(1)
    cache = Path(tempfile.mkdtemp(prefix="bench-packed-"))
    policy = load_policy(ModelConfig(name=args.model, cache_dir=cache, device="cpu"), seed=0)
    peer = load_policy(ModelConfig(name=args.peer_model, cache_dir=cache, device="cpu"))
    rng = random.Random(0)
    questions = [f"What is {rng.randint(0, 50)} {rng.choice('+-')} {rng.randint(0, 50)}?" for _ in range(2 * args.prompts)]
    prompts = [render_prompt(policy.tokenizer, q, "Answer in \\boxed{}.") for q in questions]
    gen = {b: GenerationConfig(max_new_tokens=args.max_new_tokens, batch_size=b) for b in (64, 128)}
    gen_seconds = {}
    for key, b, share in (("batch64_plain", 64, False), ("batch64", 64, True), ("batch128", 128, True)):
        generator = HFGenerator(policy, gen[b], seed=0, share_prompts=share)
        generator.generate(prompts[:2], n=args.group)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            generator.generate(prompts[: args.prompts], n=args.group)
            times.append(time.perf_counter() - start)
        gen_seconds[key] = statistics.median(times)
    own = _samples(policy, HFGenerator(policy, gen[64], seed=0), prompts[: args.prompts], args.group, "self", rng)
    theirs = _samples(peer, HFGenerator(peer, gen[64], seed=1), prompts[args.prompts:], args.group, "peer", rng)
    samples = own + theirs
    state = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    ocfg = ObjectiveConfig(correction="tis", filter="on")
    train_seconds, norms = {}, {}
    for name, size, pack in (("one_prompt", args.micro_batch_size, False), ("packed", args.pack_size, True)):
        policy.model.load_state_dict(state)
        trainer = Trainer(policy, TrainConfig(learning_rate=1e-12, micro_batch_size=size, pack_prompts=pack), ocfg, 1.0)
        norms[name] = trainer.step(samples)["grad_norm"]
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            trainer.step(samples)
            times.append(time.perf_counter() - start)
        train_seconds[name] = statistics.median(times)
    emit({
        "benchmark": "packed_step", "model": args.model, "prompts": args.prompts, "group": args.group,
        "peer_model": args.peer_model, "peer_prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
        "train_seconds_one_prompt": train_seconds["one_prompt"], "train_seconds_packed": train_seconds["packed"],
        "train_speedup": train_seconds["one_prompt"] / train_seconds["packed"],
        "grad_norm_one_prompt": norms["one_prompt"], "grad_norm_packed": norms["packed"],
        **{f"gen_seconds_{k}": v for k, v in gen_seconds.items()},
        "gen_speedup_shared_prefill": gen_seconds["batch64_plain"] / gen_seconds["batch64"],
        "gen_speedup_batch128": gen_seconds["batch64"] / gen_seconds["batch128"],
    })


if __name__ == "__main__":
    main()
