"""Crash and verifier-stall attacks of a hostile peer on an honest node (docs/method.md).

Two nodes with tiny random models share an in-memory swarm and take turns: the attacker publishes
one step's groups, then the honest node takes a step. The attacker is a real node whose generator
is replaced, so its groups are well-formed and signed but carry what an attacker chooses:

    baseline-*   the attacker's own honest groups
    lp-90-vis    every logprob -90 (plain VIS crashed with a non-finite loss)
    lp-20-vis    every logprob -20 (VIS: huge weights and losses)
    lp-20-ftis   every logprob -20 on F-TIS
    lp-90-ftis   every logprob -90 on F-TIS (is_weight_max was Infinity)
    stall-fact   every answer `\\boxed{99!!}` (the verifier runs into its timeout)
    stall-tower  every answer `\\boxed{9^{9^9}}`
    stall-unscreened  every answer `\\boxed{\\pi^{2}}`, scored by a verifier that never returns on
                 `\\pi` (it stands in for an answer that passes any pre-screen but stalls sympy)

Reported per scenario: the honest node's step times, whether it crashed, peer samples used, its
drops by reason and whether every metric was finite. The numeric attacks score rewards with a hash
of the text (tiny random models never answer right, and GRPO needs mixed rewards for peer samples
to carry gradient); the stall attacks use the task's real reward (math-verify in its worker).
The script uses only interfaces that predate the hostile-peer work, so running it with PYTHONPATH
pointing at an older tree measures the "before".

    python -m benchmarks.hostile_peers [--steps 3] [--stall-steps 2] [--only lp-90-vis ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import emit
from swarm_node.node.assemble import build_parts
from swarm_node.config import NodeConfig
from swarm_node.config.objective import VARIANT_SWITCHES
from swarm_node.node.loop import Node
from swarm_node.policy.types import GeneratedCompletion
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport

SWARM = "hostile-bench"
SCENARIOS = {
    "baseline-vis": ("vis", None, None, "hash"),
    "lp-90-vis": ("vis", -90.0, None, "hash"),
    "lp-20-vis": ("vis", -20.0, None, "hash"),
    "lp-20-ftis": ("f-tis", -20.0, None, "hash"),
    "lp-90-ftis": ("f-tis", -90.0, None, "hash"),
    "baseline-real-reward": ("f-tis", None, None, "real"),
    "stall-fact": ("f-tis", None, "\\boxed{99!!}", "real"),
    "stall-tower": ("f-tis", None, "\\boxed{9^{9^9}}", "real"),
    "stall-unscreened": ("f-tis", None, "\\boxed{\\pi^{2}}", "stall-pi"),
}


def stall_on_pi(gold: str, prediction: str) -> bool:
    """The verifier of `stall-unscreened` (runs in the reward worker process)."""
    if "\\pi" in prediction:
        time.sleep(60)
    return False


def hash_reward(text: str, problem: object) -> float:
    return float(hashlib.sha256(text.encode()).digest()[0] % 2 == 0)


def make_node(root: Path, swarm: MemorySwarm, name: str, variant: str) -> Node:
    cfg = NodeConfig.load(None, [
        f'node_dir="{root / name}"', 'model.name="tiny-random:64x1:a"', f'model.cache_dir="{root.parent / "cache"}"',
        'model.device="cpu"', "generation.group_size=8", "generation.max_new_tokens=24",
        "train.prompts_per_step=2", "train.learning_rate=1e-3", "train.total_steps=100", "train.micro_batch_size=8",
        f'swarm.swarm_id="{SWARM}"', "swarm.max_peer_fraction=0.5", "swarm.max_peer_groups_per_step=4",
        "swarm.fetch_timeout_s=2.0", "checkpoint.every_steps=1000", "task.levels=[1]", "task.size=50",
        *(f'objective.{k}="{v}"' for k, v in zip(("correction", "filter"), VARIANT_SWITCHES[variant])),
        "metrics.jsonl=false"])
    parts, start = build_parts(cfg, transport=MemoryTransport(swarm, peer_id=name))
    return Node(parts, start_step=start)


def make_hostile(node: Node, logprob: float | None, text: str | None) -> None:
    generate = node.parts.generator.generate
    ids = None
    if text is not None:
        ids = np.asarray(node.parts.policy.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)

    def hostile(prompt_ids, n):
        out = generate(prompt_ids, n)
        if ids is not None:
            out = [[GeneratedCompletion(ids, np.full(len(ids), -1.0, dtype=np.float32), "stop") for _ in g] for g in out]
        if logprob is not None:
            out = [[dataclasses.replace(c, logprobs=np.full_like(c.logprobs, logprob)) for c in g] for g in out]
        return out

    node.parts.generator.generate = hostile


def run_scenario(name: str, steps: int, root: Path) -> dict:
    variant, logprob, text, reward = SCENARIOS[name]
    swarm = MemorySwarm()
    evil = make_node(root / name, swarm, "evil", "f-tis")
    honest = make_node(root / name, swarm, "honest", variant)
    evil.parts.reward_fn = hash_reward
    if reward == "hash":
        honest.parts.reward_fn = hash_reward
    elif reward == "stall-pi":
        from benchmarks.hostile_peers import stall_on_pi as by_name  # picklable also when run as __main__
        from swarm_node.tasks.rewards import CorrectnessReward

        honest.parts.reward_fn.close()
        honest.parts.reward_fn = CorrectnessReward("number", timeout_s=5.0, verify_fn=by_name)
        honest.parts.close_hooks.append(honest.parts.reward_fn.close)
    make_hostile(evil, logprob, text)
    honest.run_step()  # warm-up: first-call costs (math-verify worker, allocator) are not the attack's
    times, peer_used, finite, crashed, last = [], [], True, None, {}
    try:
        for _ in range(steps):
            evil.run_step()
            start = time.perf_counter()
            m = honest.run_step()
            times.append(time.perf_counter() - start)
            peer_used.append(m.get("peer_samples_used", 0.0))
            finite = finite and all(math.isfinite(v) for v in m.values())
            last = m
    except Exception as e:  # the "before" tree raises here: record what the user would see
        crashed = f"{type(e).__name__}: {str(e)[:120]}"
    finally:
        for node in (evil, honest):
            node._shutdown()
    return {
        "variant": variant, "steps": len(times), "crashed": crashed,
        "step_seconds": [round(t, 3) for t in times],
        "step_seconds_median": round(statistics.median(times), 3) if times else None,
        "peer_samples_used": peer_used, "all_metrics_finite": finite if times else None,
        "is_weight_max": last.get("is_weight_max"), "loss": last.get("loss"),
        "drops": {k.removeprefix("dropped_"): v for k, v in last.items() if k.startswith("dropped_")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="honest steps per numeric scenario")
    parser.add_argument("--stall-steps", type=int, default=2, help="honest steps per stall scenario")
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS), help="run only these scenarios")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="hostile-bench-") as tmp:
        for name in args.only or list(SCENARIOS):
            steps = args.stall_steps if name.startswith("stall") else args.steps
            results[name] = run_scenario(name, steps, Path(tmp) / "runs")
            print(name, results[name], flush=True)
    base = results.get("baseline-real-reward", {}).get("step_seconds_median")
    ratios = {n: round(r["step_seconds_median"] / base, 2) for n, r in results.items()
              if base and r.get("step_seconds_median") and n.startswith("stall")}
    emit({"benchmark": "hostile_peers", "scenarios": results, "stall_vs_baseline_step_time": ratios})


if __name__ == "__main__":
    main()
