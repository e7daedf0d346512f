"""Red team: a hostile peer process (redteam_attacker.py, written against the wire and the DHT) attacks
a live local swarm of two honest tiny-model nodes, one on plain VIS and one on F-TIS (docs/method.md,
hostile peers; the attacks of issue 11, and issue 21's version grinding against the prompt binding).

The honest nodes start from a warm tiny model (conftest.warm_model): their answers sometimes earn
reward, so they learn (the first test checks it) and an attack has something to harm. For each
attack, in the same swarm: two rounds of honest steps without the attack (the baseline), the
attack, two rounds under attack. Asserted for both honest nodes: no crash, every metric finite,
step time within 1.5x of the baseline (plus an allowance for DHT jitter), the expected drop reason
counted, the other honest node's groups used in most steps, and no reward drop beyond the
baseline's noise; the last test pools the rewards of every attack (redteam_measure says how the
noise and the attacker's share of an update are measured). The attacks against learning: forged
logprobs on groups that earn reward (at the floor, or claiming certainty), another tokenizer's
texts (malformed, or valid with forged certainty), and a Sybil flood of small records on one
index key; the harness (the attacker's client, the honest nodes as observed) is redteam_harness.py.

The peer cap leaves room for attackers' groups next to the honest peer's (4 peer groups a step,
2 own), so the checks are exercised, not just starved. Step time is compared as the median wall
time of a step divided by the wall time of its own generation (which no peer touches), so that a
machine whose load changes between the baseline and the attack (this one is shared) does not
decide the outcome, while a stall (waiting on a verifier, on the network, training on junk) still
does; raw wall and process-CPU medians are reported too. The baseline rounds are paced like the
attack rounds; an attack whose rounds were slow is measured again (up to 3 times), so that a cost it
causes, there in every measurement, fails and a burst of load elsewhere does not. Set REDTEAM_REPORT=<path> to write the
measurements as JSON lines (the issue's closing table).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from pathlib import Path

import pytest

from swarm_node.node.assemble import build_parts, start_transport
from swarm_node.config import NodeConfig
from swarm_node.node.loop import Node
from tests.integration.redteam_harness import (
    MAX_TOKENS,
    PROMPTS,
    SWARM,
    Attacker,
    G,
    Honest,
    _context,
    _delta,
    _dht_refusals,
    _drops,
    _rounds,
    _summary,
    learning,
)
from tests.integration.redteam_measure import REWARD_NOISE_SE, difference_noise, restore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
BASELINE_ROUNDS, ATTACK_ROUNDS = 2, 2
MAX_SLOWDOWN = 1.5  # median step time under attack / without
MAX_STALL = 2.0  # the slowest step under attack / the slowest without
# Warm models answer in a few tokens: a step is ~0.1-0.3 s, set by DHT round trips more than by
# generation, so a step under attack is judged less an allowance (seconds) before it is normalised:
# JITTER_S for the median (DHT jitter under load), STALL_S for the slowest (the peer verification
# budget, task.peer_reward_budget_s = 0.5 s, plus jitter). A wait on a fetch timeout
# (swarm.fetch_timeout_s = 4 s) or a verifier stall still fails.
JITTER_S, STALL_S = 0.25, 1.0
# Between the rounds under attack: gathers run off the step thread, and on a loaded machine a DHT read
# can outlast several of these short steps (seen: no peer group at all in two back-to-back rounds).
ROUND_PAUSE_S = 1.0
WARM_BASE = "tiny-random:64x1:a"  # both honest nodes start from its warm model (conftest.warm_model)
# 300 warm-up steps: about 0.13 of its sampled level-1 answers earn reward (120 steps: about 0.07).
WARM_STEPS = 300
LEARN_ROUNDS = 4  # the first test's rounds, in which the honest nodes must be seen learning
RUNS: list[dict] = []  # every attack's summary, for the suite-wide reward comparison (the last test)
MAX_SUBKEYS_PER_KEY = 32  # the per-key cap of every replica: the Sybil index flood holds more identities
# The forged-logprob attacks that declare a model no node holds are bounded by the truncation C and
# the KL filter, with no drop reason. The honest nodes hold their public warm model as a spot-check
# reference (swarm.spot_check.reference_models, added in node_config): a forgery declaring it is
# dropped as logprob_mismatch.
LOGPROB_CHECK_REASON: str | None = None


def node_config(tmp: Path, name: str, variant: str, peers: list[str], model: str, seed: int = 0) -> NodeConfig:
    # Distinct seeds: two nodes holding the same model and the same sampling seed would publish
    # token-identical completions, which the replay rule rightly treats as duplicates.
    return NodeConfig.load(None, [
        f'node_dir="{tmp / name}"', f'model.name="{model}"', f'model.cache_dir="{tmp / "cache"}"',
        'model.device="cpu"', f"generation.group_size={G}", f"generation.max_new_tokens={MAX_TOKENS}",
        f"train.prompts_per_step={PROMPTS}", "train.learning_rate=1e-3", "train.total_steps=1000", f"train.seed={seed}",
        f'objective.variant="{variant}"', f'swarm.swarm_id="{SWARM}"', 'swarm.host_maddrs=["/ip4/127.0.0.1/tcp/0"]',
        f"swarm.initial_peers={json.dumps(peers)}", "swarm.max_peer_fraction=0.75", "swarm.max_peer_groups_per_step=4",
        "swarm.max_groups_per_peer=4", "swarm.fetch_timeout_s=4.0", "swarm.window_seconds=5.0",
        "swarm.staleness_steps=2", "swarm.slots_per_window=64", "swarm.record_ttl_s=60.0",
        f"swarm.max_subkeys_per_key={MAX_SUBKEYS_PER_KEY}", "checkpoint.every_steps=1000", "task.levels=[1]",
        "task.size=2000", "task.reward_timeout_s=1.0", "task.format_reward=0.0", "metrics.jsonl=false",
        # Verification budgets sized to this tiny model's ~1 s step, as an operator sizes them to theirs.
        "task.peer_reward_budget_s=0.5", "task.peer_reward_budget_per_peer_s=0.25",
        f"swarm.spot_check.reference_models={json.dumps([model])}"])



@pytest.fixture(scope="module")
def redteam(tmp_path_factory, warm_model):
    tmp = tmp_path_factory.mktemp("redteam")
    model = str(warm_model(WARM_BASE, steps=WARM_STEPS))
    boot = start_transport(node_config(tmp, "bootstrap", "f-tis", [], model).swarm, tmp / "bootstrap")
    peers = list(boot.visible_maddrs)
    nodes = []
    attacker = Attacker(peers)  # starts now: it makes its identities' keys while the honest nodes load
    try:
        for seed, (name, variant) in enumerate((("vis", "vis"), ("ftis", "f-tis")), start=1):
            cfg = node_config(tmp, name, variant, peers, model, seed)
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
        restore()
        for h in nodes:
            h.node._shutdown()
        boot.shutdown()


def run_attack(redteam, name: str, raw: dict | None = None, rounds: int = ATTACK_ROUNDS,
               pause_s: float = ROUND_PAUSE_S) -> dict:
    """The attack's summary over `rounds` rounds after the attack (`pause_s` apart); `raw`
    (optional) receives the attacker's answer, identities included."""
    nodes, attacker, ctx, boot = redteam
    # The baseline rounds have the attack rounds' pauses: a pause lets the gathers finish, so a step
    # after one trains on more peer samples than a step straight after another.
    before = _rounds(nodes, BASELINE_ROUNDS, pause_s)
    drops0, refused0 = _drops(nodes), _dht_refusals(nodes, boot)
    marks = [len(h.verdicts) for h in nodes]
    attack = attacker.attack(name, ctx)
    assert "error" not in attack, attack
    if raw is not None:
        raw.update(attack)
    during = _rounds(nodes, rounds, pause_s)
    summary = _summary(name, nodes, before, during, _delta(_drops(nodes), drops0), attack, JITTER_S, STALL_S)
    summary["dht_refused"] = _delta(_dht_refusals(nodes, boot), refused0)
    honest = {h.peer_id for h in nodes}  # drops of the honest nodes' own groups, by reason
    summary["honest_drops"] = dict(Counter(r for h, m in zip(nodes, marks) for o, r in h.verdicts[m:]
                                           if o in honest and r))
    RUNS.append(summary)
    if os.environ.get("REDTEAM_REPORT"):
        with open(os.environ["REDTEAM_REPORT"], "a") as f:
            f.write(json.dumps(summary) + "\n")
    return summary


def within_time(s: dict) -> bool:
    """The median step under attack (less JITTER_S) within MAX_SLOWDOWN of the baseline's, both in
    units of their own generation time."""
    return s["attack_rel_s_less_jitter"] <= MAX_SLOWDOWN * s["baseline_rel_s"]


def timing(s: dict) -> str:
    """The timing fields of a summary, for an assertion message short enough to be printed whole."""
    keys = ("attack", "baseline_step_s", "attack_step_s", "max_attack_step_s", "baseline_cpu_s", "attack_cpu_s",
            "baseline_rel_s", "attack_rel_s", "attack_rel_s_less_jitter", "baseline_rel_max", "attack_rel_max_less_stall",
            "parts_s", "slowest")
    return json.dumps({k: round(s[k], 3) if isinstance(s[k], float) else s[k] for k in keys})


def check_bounded(s: dict, reason: str | None) -> None:
    assert not s["errors"], s
    # No reward drop beyond the baseline's noise (redteam_measure; with 2 rounds' 32 completions a
    # side this catches only a collapse: the suite-wide comparison, the last test, pools every attack).
    assert s["reward"]["within_noise"], s
    assert not s["nonfinite"], s
    assert within_time(s), timing(s)
    # No single stalled step either (before the verification budgets a verifier bomb made 26 s and 53 s steps).
    assert s["attack_rel_max_less_stall"] <= max(MAX_STALL * s["baseline_rel_max"], 4.0), timing(s)
    if reason is not None:
        assert s["drops"].get(reason, 0) >= 1, s
    assert s["honest_used_share"] >= 0.5, s


def test_honest_nodes_learn(redteam) -> None:
    """Before any attack: the warm honest nodes' completions earn reward and their steps have a
    non-zero loss and gradient norm, so the attacks below act on nodes that learn."""
    nodes = redteam[0]
    rows = _rounds(nodes, LEARN_ROUNDS)
    got = learning(rows)
    print(json.dumps({"learning": got}))
    assert not [r["error"] for r in rows if r["error"]], rows
    assert got["reward_mean"] > 0 and got["loss_nonzero_steps"] >= 1 and got["grad_nonzero_steps"] >= 1, got


# Each attack of issue 11: (name, the drop reason it must be counted under). Issue 21's version
# grinding has its own test below.
ATTACKS = [
    ("cherry_picked_prompts", "wrong_prompt"),
    ("tiny_groups", "group_too_small"),
    ("oversized_groups", "group_too_large"),
    ("replay", None),  # "duplicate" when the replayed completions are long enough to be fingerprints
    ("poisoned_logprobs", "logprob_below_floor"),
    ("verifier_bomb", None),  # answers are pre-screened (reward 0, no verifier call), or time out and drop
    ("hedged_answers", None),
    ("sybil_share", None),
    # Against nodes that learn: forged logprobs on groups with correct answers (bounded by C and the
    # KL filter), a Sybil flood of small records on one index key (bounded by the per-key caps), and
    # another tokenizer's texts (malformed: dropped; valid with forged certainty: bounded).
    ("forged_floor_logprobs", LOGPROB_CHECK_REASON),
    ("forged_certain_logprobs", LOGPROB_CHECK_REASON),
    ("forged_floor_declared", "logprob_mismatch"),  # declaring the reference model: spot-checked
    ("crosstok_malformed", "text_pieces_mismatch"),
    ("crosstok_certain", None),
    ("sybil_index", None),
    ("flood", None),  # refused in the DHT (checked below); what gets through is dropped as wrong_prompt
    # (or index_mismatch: its records for the next window list entries stamped in this one)
]


@pytest.mark.parametrize(("name", "reason"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_bounded(redteam, name: str, reason: str | None) -> None:
    # The Sybil index records fill the live window's key and the next two: rounds over all three.
    # The flood's records sit in two windows' keys: rounds over both (two rounds of these ~0.2 s
    # steps would only sample the second after it, while the replicas still take the flood in).
    # The three malformed kinds (one identity each) get rounds enough for each to be sampled.
    ws = redteam[2]["window_seconds"]
    rounds, pause = {"sybil_index": (4, ws), "flood": (4, ws / 2), "crosstok_malformed": (4, ROUND_PAUSE_S)}.get(
        name, (ATTACK_ROUNDS, ROUND_PAUSE_S))
    expected = [r for r in (reason, *(("text_invalid_utf8", "text_too_long") if name == "crosstok_malformed" else ()))
                if r is not None]
    # Gathers are best-effort samples: an attack no gather read is made again. So is one whose steps
    # were slow: a cost the attack causes is there in every measurement, a burst of load from the
    # rest of this shared 2-core machine (CI once: a 0.13 s baseline step, then 0.48 s) is not.
    for _attempt in range(3):
        s = run_attack(redteam, name, rounds=rounds, pause_s=pause)
        if all(s["drops"].get(r, 0) >= 1 for r in expected) and within_time(s):
            break
    check_bounded(s, reason)
    if name == "replay":
        assert s["attacker"]["replayed"] >= 1, s  # the attacker did find honest groups to replay
        # Warm models answer in a few tokens, below the replay rule's fingerprint length: their
        # replays look like honest repeats of a short answer. Longer ones are refused.
        if s["attacker"]["replayed_fingerprinted"]:
            assert s["drops"].get("duplicate", 0) >= 1, s
    if name == "hedged_answers":
        assert s["attacker_rewards"] in ([], [0.0]), s  # no hedged answer earns a reward
    if name == "sybil_share":  # 15 fresh identities with valid groups only get the room honest peers leave
        assert s["honest_used_share"] >= 0.75, s
    if name in ("forged_floor_logprobs", "forged_certain_logprobs", "crosstok_certain"):
        # On the F-TIS node forged logprobs buy at most C times the weight the samples would have with
        # honest on-policy logprobs (redteam_measure), whatever they claim.
        ftis = s["update_share"].get("f-tis")
        assert ftis is None or ftis["weight_gain"] <= redteam[0][1].node.cfg.objective.truncation_c + 1e-6, s
    if name == "sybil_index":  # more identities than a key holds: refused over the cap, honest groups read
        assert s["attacker"]["sybil_stored"] >= 1, s
        assert s["dht_refused"].get("subkeys_per_key", 0) >= 1, s
    for r in expected:  # (crosstok_malformed: each malformed kind under its own reason)
        assert s["drops"].get(r, 0) >= 1, s
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
            slots.append(fast.node._slots.slot)
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


def test_reward_under_attack_over_the_suite() -> None:
    """Pooled over every attack run above (the baseline rounds before each attack against the
    rounds under it): the honest nodes kept learning (reward and non-zero gradients in the
    baselines) and their mean reward under attack is not lower than without beyond its noise."""
    if len(RUNS) < 5:
        pytest.skip("too few attacks ran in this run to pool")
    gb = [x for r in RUNS for x in r["reward"]["group_means"][0]]
    ga = [x for r in RUNS for x in r["reward"]["group_means"][1]]
    base, under, se = sum(gb) / len(gb), sum(ga) / len(ga), difference_noise(gb, ga)
    pooled = {"baseline": round(base, 4), "attack": round(under, 4), "groups": [len(gb), len(ga)], "se": round(se, 4),
              "grad_nonzero_baseline_steps": sum(r["baseline_trained"]["grad_nonzero_steps"] for r in RUNS),
              "per_attack": {r["attack"]: [r["reward"]["baseline"], r["reward"]["attack"]] for r in RUNS}}
    print(json.dumps({"suite_reward": pooled}))
    if os.environ.get("REDTEAM_REPORT"):
        with open(os.environ["REDTEAM_REPORT"], "a") as f:
            f.write(json.dumps({"suite_reward": pooled}) + "\n")
    assert base > 0 and pooled["grad_nonzero_baseline_steps"] >= 1, pooled
    assert under >= base - REWARD_NOISE_SE * se, pooled
