"""Red team: a hostile peer process (redteam_attacker.py, written against the wire and the DHT) attacks
a live local swarm of two honest tiny-model nodes, one on plain VIS and one on F-TIS (DESIGN.md
section 8, the attacks of issue 11, and issue 21's version grinding against the prompt binding).

For each attack, in the same swarm: two rounds of honest steps without the attack (the baseline),
the attack, two rounds under attack. Asserted for both honest nodes: no crash, every metric
finite, step time within 1.5x of the baseline, the expected drop reason counted, and the other
honest node's groups used in most steps.

The peer cap leaves room for attackers' groups next to the honest peer's (4 peer groups a step,
2 own), so the checks are exercised, not just starved. Step time is compared as the median wall
time of a step divided by the wall time of its own generation (which no peer touches), so that a
machine whose load changes between the baseline and the attack (this one is shared) does not
decide the outcome, while a stall (waiting on a verifier, on the network, training on junk) still
does; raw wall and process-CPU medians are reported too. Set REDTEAM_REPORT=<path> to write the
measurements as JSON lines (the issue's closing table).
"""

from __future__ import annotations

import json
import math
import os
import select
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from swarm_node.assemble import build_parts, start_transport
from swarm_node.config import NodeConfig
from swarm_node.node import Node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
SWARM = "redteam"
G, MAX_TOKENS, PROMPTS = 4, 32, 2
REPO = Path(__file__).resolve().parents[2]
BASELINE_ROUNDS, ATTACK_ROUNDS = 2, 2
MAX_SLOWDOWN = 1.5  # median step time under attack / without
MAX_STALL = 2.0  # the slowest step under attack / the slowest without


def node_config(tmp: Path, name: str, variant: str, peers: list[str], seed: int = 0) -> NodeConfig:
    # Distinct seeds: two nodes holding the same tiny random model and the same sampling seed would
    # publish token-identical completions, which the replay rule rightly treats as duplicates.
    return NodeConfig.load(None, [
        f'node_dir="{tmp / name}"', 'model.name="tiny-random:64x1:a"', f'model.cache_dir="{tmp / "cache"}"',
        'model.device="cpu"', f"generation.group_size={G}", f"generation.max_new_tokens={MAX_TOKENS}",
        f"train.prompts_per_step={PROMPTS}", "train.learning_rate=1e-3", "train.total_steps=1000", f"train.seed={seed}",
        f'objective.variant="{variant}"', f'swarm.swarm_id="{SWARM}"', 'swarm.host_maddrs=["/ip4/127.0.0.1/tcp/0"]',
        f"swarm.initial_peers={json.dumps(peers)}", "swarm.max_peer_fraction=0.75", "swarm.max_peer_groups_per_step=4",
        "swarm.max_groups_per_peer=4", "swarm.fetch_timeout_s=4.0", "swarm.window_seconds=5.0",
        "swarm.staleness_steps=2", "swarm.slots_per_window=64", "swarm.record_ttl_s=60.0", "checkpoint.every_steps=1000", "task.levels=[1]",
        "task.size=2000", "task.reward_timeout_s=1.0", "task.format_reward=0.0", "metrics.jsonl=false",
        # Verification budgets sized to this tiny model's ~1 s step, as an operator sizes them to theirs.
        "task.peer_reward_budget_s=0.5", "task.peer_reward_budget_per_peer_s=0.25"])


class Attacker:
    """The attacker process: one JSON command per line in, one JSON result per line out."""

    def __init__(self, initial_peers: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        args = [sys.executable, "-m", "tests.integration.redteam_attacker"]
        for p in initial_peers:
            args += ["--initial-peer", p]
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def wait_ready(self) -> None:
        assert self._answer(120.0).get("ready"), "attacker did not start"

    def _answer(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise AssertionError(f"the attacker process gave no answer within {timeout:.0f}s (exit {self.proc.poll()})")
        return json.loads(line)

    def attack(self, name: str, ctx: dict) -> dict:
        self.proc.stdin.write(json.dumps({"op": "attack", "name": name, "ctx": ctx}) + "\n")
        self.proc.stdin.flush()
        return self._answer(120.0)

    def close(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


class Honest:
    """An honest node with what the suite observes: per-step metrics, step errors, samples used, and
    every admission verdict by owner (`verdicts`: (owner, None) taken, (owner, reason) dropped)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.samples: list = []
        original = node.parts.trainer.step
        node.parts.trainer.step = lambda samples: (self.samples.append(list(samples)), original(samples))[1]
        self.verdicts: list[tuple[str, str | None]] = []
        admission = node.parts.exchange.admission
        record = admission.record
        admission.record = lambda owner, reason: (self.verdicts.append((owner, reason)), record(owner, reason))[1]

    @property
    def peer_id(self) -> str:
        return self.node.parts.peer_id

    def step(self) -> dict:
        self.samples.append(None)  # replaced by the trainer hook when the step trains
        t0, cpu0 = time.perf_counter(), time.process_time()
        try:
            metrics, error = self.node.run_step(), None
        except Exception as e:  # a crash is an outcome the suite reports, not a harness failure
            metrics, error = {}, f"{type(e).__name__}: {e}"
        cpu = time.process_time() - cpu0
        samples = self.samples.pop() if self.samples and self.samples[-1] is not None else []
        if self.samples and self.samples[-1] is None:
            self.samples.pop()
        return {"seconds": time.perf_counter() - t0, "cpu": cpu, "metrics": metrics, "error": error, "samples": samples}


def _text_tokens(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)[:MAX_TOKENS]


def _context(node: Node, honest_peers: list[str]) -> dict:
    ps, tok = node.parts.prompt_set, node.parts.policy.tokenizer
    hedged = {}
    for p in ps.problems:
        g, w = p.answer, str(int(p.answer) + 1) if p.answer.lstrip("-").isdigit() else p.answer + "1"
        hedged[str(p.index)] = [_text_tokens(tok, t) for t in (
            f"\\boxed{{{g} \\text{{(or {w})}}}}", f"\\boxed{{{w}}} \\boxed{{{g}}}", f"\\boxed{{{w} = {g}}}", f"{g}")]
    bombs = [_text_tokens(tok, t) for t in ("\\boxed{99!!}", "\\boxed{9^{9^9}}", "\\boxed{9^{9^{9^9}}}", "\\boxed{99!!!}")]
    easy = sorted(range(len(ps)), key=lambda i: (len(ps.problems[i].answer), ps.problems[i].answer))
    return {"swarm": SWARM, "window_seconds": node.cfg.swarm.window_seconds, "prompt_set_id": ps.id,
            "staleness_windows": node.cfg.swarm.staleness_steps, "slots_per_window": node.cfg.swarm.slots_per_window,
            "easy_indices": easy, "set_size": len(ps), "shas": [p.sha256 for p in ps.problems], "prompts_per_step": PROMPTS,
            "group_size": G, "max_new_tokens": MAX_TOKENS, "vocab": len(tok), "fingerprint": node.parts.policy.fingerprint,
            "texts": {"bombs": bombs, "hedged": hedged}, "honest_peers": honest_peers, "easy_index": 0,
            "groups_per_identity": 4}


@pytest.fixture(scope="module")
def redteam(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("redteam")
    boot = start_transport(node_config(tmp, "bootstrap", "f-tis", []).swarm, tmp / "bootstrap")
    peers = list(boot.visible_maddrs)
    nodes = []
    attacker = Attacker(peers)  # starts now: it makes its identities' keys while the honest nodes load
    try:
        for seed, (name, variant) in enumerate((("vis", "vis"), ("ftis", "f-tis")), start=1):
            cfg = node_config(tmp, name, variant, peers, seed)
            transport = start_transport(cfg.swarm, cfg.node_dir)
            parts, start = build_parts(cfg, transport=transport)
            parts.close_hooks.append(transport.shutdown)
            nodes.append(Honest(Node(parts, start_step=start)))
        attacker.wait_ready()
        for _ in range(2):  # warm up (first forward passes, the honest nodes' records of each other)
            for h in nodes:
                h.step()
        yield nodes, attacker, _context(nodes[0].node, [h.peer_id for h in nodes]), boot
    finally:
        attacker.close()
        for h in nodes:
            h.node._shutdown()
        boot.shutdown()


def _rounds(nodes: list[Honest], n: int) -> list[dict]:
    out = []
    for _ in range(n):
        for h in nodes:
            out.append({"node": h.peer_id, **h.step()})
    return out


def _summary(name: str, nodes: list[Honest], before: list[dict], during: list[dict], drops_delta: dict,
             attack: dict) -> dict:
    others = {h.peer_id: {o.peer_id for o in nodes if o is not h} for h in nodes}
    honest_used = [bool({s.source for s in r["samples"] if s.is_peer} & others[r["node"]]) for r in during]
    attacker_ids = set(attack.get("identities", ()))
    from_attacker = [s for r in during for s in r["samples"] if s.is_peer and s.source in attacker_ids]
    return {
        "attack": name,
        "baseline_step_s": statistics.median(r["seconds"] for r in before),
        "attack_step_s": statistics.median(r["seconds"] for r in during),
        "max_attack_step_s": max(r["seconds"] for r in during),
        "baseline_cpu_s": statistics.median(r["cpu"] for r in before),
        "attack_cpu_s": statistics.median(r["cpu"] for r in during),
        "baseline_rel_s": statistics.median(_relative(r) for r in before),
        "attack_rel_s": statistics.median(_relative(r) for r in during),
        "baseline_rel_max": max(_relative(r) for r in before),
        "attack_rel_max": max(_relative(r) for r in during),
        "parts_s": {part: [round(statistics.median(r["metrics"].get(f"{part}_seconds", 0.0) for r in rs), 3)
                           for rs in (before, during)] for part in ("gen", "train")},
        "errors": [r["error"] for r in before + during if r["error"]],
        "nonfinite": sorted({k for r in during for k, v in r["metrics"].items()
                             if isinstance(v, float) and not math.isfinite(v)}),
        "honest_used_share": sum(honest_used) / len(honest_used),
        "attacker_samples": len(from_attacker),
        "attacker_rewards": sorted({s.reward for s in from_attacker}),
        "drops": drops_delta,
        "attacker": {k: v for k, v in attack.items() if k != "identities"},
    }


def _relative(r: dict) -> float:
    """A step's wall time in units of its own generation's wall time (load-normalised)."""
    return r["seconds"] / max(r["metrics"].get("gen_seconds", 0.0), 1e-3)


def _drops(nodes: list[Honest]) -> dict[str, int]:
    total: dict[str, int] = {}
    for h in nodes:
        for k, v in h.node._drops.items():
            total[k] = total.get(k, 0) + int(v)
    return total


def _dht_refusals(nodes: list[Honest], boot) -> dict[str, int]:
    """Records refused by the honest DHT processes (the bootstrap peer's included: any of them may be
    the replica an attacker's store is sent to)."""
    total: dict[str, int] = {}
    for transport in [boot, *(h.node.parts.exchange.transport for h in nodes)]:
        read = getattr(transport, "dht_refusals", None)  # (absent in older code)
        for k, v in (read() if read is not None else {}).items():
            total[k] = total.get(k, 0) + v
    return total


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def run_attack(redteam, name: str, raw: dict | None = None, rounds: int = ATTACK_ROUNDS) -> dict:
    """The attack's summary over `rounds` rounds after the attack; `raw` (optional) receives the
    attacker's answer, identities included."""
    nodes, attacker, ctx, boot = redteam
    before = _rounds(nodes, BASELINE_ROUNDS)
    drops0, refused0 = _drops(nodes), _dht_refusals(nodes, boot)
    attack = attacker.attack(name, ctx)
    assert "error" not in attack, attack
    if raw is not None:
        raw.update(attack)
    during = _rounds(nodes, rounds)
    summary = _summary(name, nodes, before, during, _delta(_drops(nodes), drops0), attack)
    summary["dht_refused"] = _delta(_dht_refusals(nodes, boot), refused0)
    if os.environ.get("REDTEAM_REPORT"):
        with open(os.environ["REDTEAM_REPORT"], "a") as f:
            f.write(json.dumps(summary) + "\n")
    return summary


def check_bounded(s: dict, reason: str | None) -> None:
    assert not s["errors"], s
    assert not s["nonfinite"], s
    assert s["attack_rel_s"] <= MAX_SLOWDOWN * s["baseline_rel_s"], s
    # No single stalled step either (the verifier bomb made 26 s and 53 s steps).
    assert s["attack_rel_max"] <= max(MAX_STALL * s["baseline_rel_max"], 4.0), s
    if reason is not None:
        assert s["drops"].get(reason, 0) >= 1, s
    assert s["honest_used_share"] >= 0.5, s


# Each attack of issue 11: (name, the drop reason it must be counted under). Issue 21's version
# grinding has its own test below.
ATTACKS = [
    ("cherry_picked_prompts", "wrong_prompt"),
    ("tiny_groups", "group_too_small"),
    ("oversized_groups", "group_too_large"),
    ("replay", "duplicate"),
    ("poisoned_logprobs", "logprob_below_floor"),
    ("verifier_bomb", None),  # answers are pre-screened (reward 0, no verifier call), or time out and drop
    ("hedged_answers", None),
    ("sybil_share", None),
    ("flood", None),  # refused in the DHT (checked below); what gets through is dropped as wrong_prompt
    # (or index_mismatch: its records for the next window list entries stamped in this one)
]


@pytest.mark.parametrize(("name", "reason"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_bounded(redteam, name: str, reason: str | None) -> None:
    s = run_attack(redteam, name)
    check_bounded(s, reason)
    if name == "replay":
        assert s["attacker"]["replayed"] >= 1, s  # the attacker did find honest groups to replay
    if name == "hedged_answers":
        assert s["attacker_rewards"] in ([], [0.0]), s  # no hedged answer earns a reward
    if name == "sybil_share":  # 15 fresh identities with valid groups only get the room honest peers leave
        assert s["honest_used_share"] >= 0.75, s
    if name == "flood":
        a, refused = s["attacker"], s["dht_refused"]
        assert a["far_future_accepted"] == 0 and a["garbage_accepted"] == 0 and a["foreign_accepted"] == 0, a
        for reason in ("expiration_too_far", "off_schedule", "bad_owned_record"):
            assert refused.get(reason, 0) >= 1, refused
        # The 64 KiB index records: refused over the per-key cap or evicted for honest records.
        assert refused.get("bytes_per_key", 0) + refused.get("evicted_for_smaller", 0) >= 1, refused
        nodes = redteam[0]
        statuses = nodes[0].node.parts.exchange.read_statuses(timeout=5)
        assert all(st.step < 999999 for st in statuses)


BINDING_REASONS = ("wrong_prompt", "window_slot_overused", "index_mismatch", "stale")


def test_version_grinding_takes_nothing_and_honest_rates_pass(redteam) -> None:
    """Issue 21: groups on an easy prompt at ground policy versions (which the rule before the prompt
    binding accepted), stamped in every window peers read, give the attacker no sample; the honest
    nodes, then one of them stepping 5x as often as the other, lose no group to the binding."""
    nodes, _, ctx, _ = redteam
    honest = {h.peer_id for h in nodes}
    # The flood (the attack before this one) fills two windows' index keys with 64 KiB records; while
    # peers still read those windows their gathers can come back empty (seen: no drop and no honest
    # sample in a whole round). Start once every window peers read is past them.
    time.sleep((ctx["staleness_windows"] + 2) * ctx["window_seconds"])
    for _attempt in range(3):  # gathers are best-effort: an attack no gather read is made again
        marks = [len(h.verdicts) for h in nodes]
        raw: dict = {}
        s = run_attack(redteam, "version_grinding", raw, rounds=2 * ATTACK_ROUNDS)  # the ground groups sit in 3 windows
        assert s["attacker_samples"] == 0 and s["attacker"]["ground_groups"] >= 8, s
        grinders = set(raw["identities"])
        verdicts = [r for h, m in zip(nodes, marks) for o, r in h.verdicts[m:] if o in grinders]
        if verdicts:
            break
    check_bounded(s, "wrong_prompt")
    assert verdicts and set(verdicts) == {"wrong_prompt"}, verdicts
    fast, slow = nodes
    phase = [len(h.verdicts) for h in nodes]
    slots, took_fast, took_slow = [], 0, 0
    for _ in range(3):
        for _ in range(5):
            r = fast.step()
            assert r["error"] is None, r
            slots.append(fast.node._slot)
            took_slow += any(x.source == slow.peer_id for x in r["samples"] if x.is_peer)
        r = slow.step()
        assert r["error"] is None, r
        took_fast += any(x.source == fast.peer_id for x in r["samples"] if x.is_peer)
    # Over the whole suite so far (every attack before this one too): no honest group lost to the binding.
    lost = [v for h in nodes for v in h.verdicts if v[0] in honest and v[1] in BINDING_REASONS]
    print(json.dumps({"grind_tries": s["attacker"]["grind_tries"], "ground_groups": s["attacker"]["ground_groups"],
                      "grinders_dropped_wrong_prompt": len(verdicts), "attacker_samples": s["attacker_samples"],
                      "fast_slots": slots, "slow_took_fast": took_fast, "fast_took_slow": took_slow,
                      "honest_verdicts": [sorted(Counter((o[:6], r) for o, r in h.verdicts[m:] if o in honest).items())
                                          for h, m in zip(nodes, phase)],
                      "weights": [{o[:6]: round(h.node.parts.exchange.admission.reputation.weight(o), 3)
                                   for o in honest if o != h.peer_id} for h in nodes],
                      "excluded": [[o[:6] for o in honest if h.node.parts.exchange.admission.reputation.excluded(o)]
                                   for h in nodes],
                      "honest_drops_in_suite": [sorted(Counter(r for o, r in h.verdicts if o in honest and r).items())
                                                for h in nodes]}))
    assert not lost, lost
    # The exchange is sampled and best-effort (fetch timeouts under load count as weather): in the
    # 5x phase each node admits groups of the other (verdict None: through the binding and every
    # other check), and some of them reach training; not in every step.
    admitted_by_slow = sum(1 for o, r in slow.verdicts[phase[1]:] if o == fast.peer_id and r is None)
    admitted_by_fast = sum(1 for o, r in fast.verdicts[phase[0]:] if o == slow.peer_id and r is None)
    assert admitted_by_slow >= 1 and admitted_by_fast >= 1, (admitted_by_slow, admitted_by_fast)
    assert took_fast >= 1 and took_slow >= 1, (took_fast, took_slow)
