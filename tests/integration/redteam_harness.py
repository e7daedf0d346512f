"""The red-team suite's harness (test_redteam.py): the attacker process's client, the honest nodes
as the suite observes them, what any peer can learn of the swarm (the attacker's context), and the
rounds and summaries an attack is judged by."""

from __future__ import annotations

import json
import math
import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

from swarm_node.node.loop import Node
from tests.integration.redteam_measure import InfluenceProbe, reward_check, worst_shares

SWARM = "redteam"
G, MAX_TOKENS, PROMPTS = 4, 32, 2
REPO = Path(__file__).resolve().parents[2]
SYBIL_IDENTITIES = 48  # the Sybil index flood's identities (more than swarm.max_subkeys_per_key in the test)


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
        self.probe = InfluenceProbe(node.parts.trainer)  # each sample's influence on the step's update
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
        self.probe.last = None
        t0, cpu0 = time.perf_counter(), time.process_time()
        try:
            metrics, error = self.node.run_step(), None
        except Exception as e:  # a crash is an outcome the suite reports, not a harness failure
            metrics, error = {}, f"{type(e).__name__}: {e}"
        cpu = time.process_time() - cpu0
        samples = self.samples.pop() if self.samples and self.samples[-1] is not None else []
        if self.samples and self.samples[-1] is None:
            self.samples.pop()
        return {"seconds": time.perf_counter() - t0, "cpu": cpu, "metrics": metrics, "error": error, "samples": samples,
                "influence": self.probe.last}


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
    # Every prompt's correct answer and a wrong one, as text and as this tokenizer's tokens ending in
    # its end-of-sequence token (what the warm models write): any peer can compute them.
    answer_texts = {str(p.index): [f"\\boxed{{{p.answer}}}", f"\\boxed{{{_wrong(p.answer)}}}"] for p in ps.problems}
    answer_tokens = {k: [_text_tokens(tok, t) + [tok.eos_token_id] for t in v] for k, v in answer_texts.items()}
    return {"swarm": SWARM, "window_seconds": node.cfg.swarm.window_seconds, "prompt_set_id": ps.id,
            "staleness_windows": node.cfg.swarm.staleness_steps, "slots_per_window": node.cfg.swarm.slots_per_window,
            "easy_indices": easy, "set_size": len(ps), "shas": [p.sha256 for p in ps.problems], "prompts_per_step": PROMPTS,
            "group_size": G, "max_new_tokens": MAX_TOKENS, "vocab": len(tok), "fingerprint": node.parts.policy.fingerprint,
            "texts": {"bombs": bombs, "hedged": hedged}, "honest_peers": honest_peers, "easy_index": 0,
            "groups_per_identity": 4, "answer_texts": answer_texts, "answer_tokens": answer_tokens,
            "sybil_identities": SYBIL_IDENTITIES, "reference_model": node.parts.policy.model_id,
            "reference_revision": node.parts.policy.revision or ""}


def _wrong(answer: str) -> str:
    return str(int(answer) + 1) if answer.lstrip("-").isdigit() else answer + "1"


def _rounds(nodes: list[Honest], n: int, pause_s: float = 0.0) -> list[dict]:
    out = []
    for k in range(n):
        time.sleep(pause_s if k else 0.0)
        for h in nodes:
            out.append({"node": h.peer_id, **h.step()})
    return out


def _summary(name: str, nodes: list[Honest], before: list[dict], during: list[dict], drops_delta: dict,
             attack: dict, jitter_s: float, stall_s: float) -> dict:
    others = {h.peer_id: {o.peer_id for o in nodes if o is not h} for h in nodes}
    variants = {h.peer_id: h.node.cfg.objective.variant_name for h in nodes}
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
        # The same less the allowances for DHT jitter and the verification budget (test_redteam).
        "attack_rel_s_less_jitter": statistics.median(_relative(r, jitter_s) for r in during),
        "attack_rel_max_less_stall": max(_relative(r, stall_s) for r in during),
        "slowest": {k: round(v, 3) for k, v in max(during, key=_relative)["metrics"].items()
                    if k in ("gen_seconds", "gather_seconds", "publish_seconds", "train_seconds", "step_seconds",
                             "peer_reward_seconds")},
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
        "reward": reward_check(before, during),
        "baseline_trained": learning(before),
        "update_share": {variants[k]: v for k, v in worst_shares(during, attacker_ids).items()},
    }


def learning(rows: list[dict]) -> dict:
    """Whether the honest nodes learn in `rows`: mean own reward, and steps with a non-zero loss and
    gradient norm (a step whose groups all earn equal rewards has advantage 0: loss and gradient 0)."""
    return {"reward_mean": reward_check(rows, rows)["baseline"],
            "loss_nonzero_steps": sum(r["metrics"].get("loss", 0.0) != 0.0 for r in rows),
            "grad_nonzero_steps": sum(r["metrics"].get("grad_norm", 0.0) != 0.0 for r in rows), "steps": len(rows)}


def _relative(r: dict, allowance_s: float = 0.0) -> float:
    """A step's wall time less `allowance_s`, in units of its own generation's wall time (load-normalised)."""
    return max(r["seconds"] - allowance_s, 0.0) / max(r["metrics"].get("gen_seconds", 0.0), 1e-3)


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
