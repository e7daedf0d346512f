"""Text bound to tokens (issue 40): a peer of another tokenizer sends tokens that decode to "x = 7" with
the text "x = 42". A receiver holding the sender's tokenizer (a spot-check reference of its
fingerprint) refuses the group as `text_token_mismatch`, a fault; one that does not hold it trains on
the text, and the step's update gives those samples at most C times the weight honest, on-policy
samples of the same text would get (docs/method.md, "What a hostile peer can do"). Through the
in-memory DHT: the liar publishes like any peer, the receivers gather and step."""

from __future__ import annotations

import time

import numpy as np
import pytest

from protocol import keys
from protocol.messages import Completion, PromptRef, RolloutGroup, SamplingParams
from swarm_node.node.loop import Node
from swarm_node.peers.crosstok_receive import DROP_TEXT_TOKEN_MISMATCH, text_matches_tokens
from swarm_node.policy import tiny
from swarm_node.policy.models import tokenizer_fingerprint
from swarm_node.policy.pieces import completion_text
from swarm_node.swarm.exchange import RolloutExchange
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from tests.integration.redteam_measure import InfluenceProbe, restore, update_shares
from tests.unit.test_node_loop import SWARM, make_node

SENDER_MODEL = "tiny-random:64x1:a"
SENDER = tiny.build_tiny_tokenizer("a")
# (what the tokens say, what the text claims): rewards of the claims (tests.fakes.hash_reward) 1, 1, 0, 1
LIES = [("x = 7", "x = 42"), ("x = 8", "x = 43"), ("z = 7", "z = 42"), ("x = 9", "x = 44")]
# Per sender token. The receiver's random model gives its tokens about -6.2 (ln 512): a chunk of two
# sender bytes that is one own token is claimed at -10, rho about e^4, far above C (truncated); and
# not so low that the KL filter drops every sample (at -6 it drops all four here).
FORGED_LOGPROB = -5.0


def lying(said: str, claimed: str) -> Completion:
    ids = [*SENDER.encode(said, add_special_tokens=False), SENDER.eos_token_id]
    pieces = [1] * (len(ids) - 2) + [len(claimed.encode()) - (len(ids) - 2), 0]  # adds up to the claim's bytes
    return Completion(token_ids=np.asarray(ids, np.uint32), logprobs=np.full(len(ids), FORGED_LOGPROB, np.float32),
                      finish_reason="stop", claimed_reward=1.0, text=claimed, piece_bytes=np.asarray(pieces, np.uint16))


def honest(text: str) -> Completion:
    ids = [*SENDER.encode(text, add_special_tokens=False), SENDER.eos_token_id]
    faithful, pieces = completion_text(SENDER, ids)
    return Completion(token_ids=np.asarray(ids, np.uint32), logprobs=np.full(len(ids), -1.0, np.float32),
                      finish_reason="stop", claimed_reward=0.0, text=faithful, piece_bytes=pieces)


def publish(swarm: MemorySwarm, node: Node, sender: str, completions: list[Completion]) -> RolloutGroup:
    """`sender`'s group on a prompt the binding assigns it now, published as any peer publishes."""
    now = swarm.clock()
    assignment = node.parts.admission.binding.assignment
    index = next(i for i in range(assignment.set_size) if assignment.assigned(sender, i, now))
    problem = node.parts.prompt_set.problems[index]
    group = RolloutGroup(
        swarm_id=SWARM, sender=sender, model_id="private/unheld-model", model_revision="", policy_version=0,
        tokenizer_fingerprint=tokenizer_fingerprint(SENDER), created_at=now,
        prompt=PromptRef(prompt_set_id=node.parts.prompt_set.id, index=problem.index, sha256=problem.sha256),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=12), completions=tuple(completions))
    window = keys.window_of(now, node.cfg.swarm.window_seconds)
    RolloutExchange(MemoryTransport(swarm, sender), SWARM, vocab_size=len(SENDER)).publish_groups([group], window)
    return group


def step_with_probe(node: Node) -> tuple[dict, list, list | None]:
    """One step of `node`, with the samples it trained on and each one's influence on the update."""
    seen: list = []
    original = node.parts.trainer.step
    node.parts.trainer.step = lambda samples: (seen.append(list(samples)), original(samples))[1]
    probe = InfluenceProbe(node.parts.trainer)
    try:
        metrics = node.run_step()
    finally:
        restore()
        node.parts.trainer.step = original
    return metrics, seen[-1], probe.last


def test_the_binding_check_itself() -> None:
    said, claimed = LIES[0]
    c = lying(said, claimed)
    assert not text_matches_tokens(SENDER, c.token_ids, c.text, c.piece_bytes)
    h = honest("x = 7")
    assert text_matches_tokens(SENDER, h.token_ids, h.text, h.piece_bytes)
    assert not text_matches_tokens(SENDER, h.token_ids, h.text, h.piece_bytes[::-1])  # pieces are bound too
    assert not text_matches_tokens(SENDER, [*h.token_ids, 10_000], h.text, [*h.piece_bytes, 0])  # no such token


@pytest.fixture(scope="module")
def receivers(tmp_path_factory):
    """Two receivers on tokenizer c: one holds the sender's tokenizer (a reference model of it), one
    does not; each in its own in-memory swarm (a liar and an honest peer of tokenizer a publish there)."""
    tmp = tmp_path_factory.mktemp("binding")
    swarms = [MemorySwarm(), MemorySwarm()]
    holder = make_node(tmp, swarms[0], "holder", model="tiny-random:64x1:c",
                       extra=[f'swarm.spot_check.reference_models=["{SENDER_MODEL}"]'])
    blind = make_node(tmp, swarms[1], "blind", model="tiny-random:64x1:c")
    return swarms, holder, blind


def test_a_receiver_holding_the_senders_tokenizer_refuses_a_lying_text(receivers) -> None:
    (swarm, _), holder, _ = receivers
    lie = publish(swarm, holder, "liar", [lying(*x) for x in LIES])
    publish(swarm, holder, "honest-a", [honest(t) for t in ("x = 5", "x = 6", "y = 5", "x = 3")])
    metrics, samples, _ = step_with_probe(holder)
    assert metrics.get(f"dropped_{DROP_TEXT_TOKEN_MISMATCH}") == 1, metrics
    assert {s.source for s in samples if s.is_peer} == {"honest-a"}  # the honest text of tokenizer a is taken
    rep = holder.parts.admission.reputation
    assert rep.faults["liar"] == pytest.approx(1.0) and rep.standing("liar") == "probe"
    from swarm_node.node.peer_rollouts import group_record_id
    assert group_record_id(lie) in holder.parts.rejects  # refused for good


def test_a_receiver_without_it_trains_on_the_text_within_the_bound(receivers) -> None:
    (_, swarm), _, blind = receivers
    publish(swarm, blind, "liar", [lying(*x) for x in LIES])
    for _ in range(3):  # the gather runs beside the step; a step may start before the group is read
        metrics, samples, influence = step_with_probe(blind)
        if any(s.source == "liar" for s in samples):
            break
        time.sleep(0.2)
    theirs = [s for s in samples if s.source == "liar"]
    tok = blind.parts.policy.tokenizer
    assert sorted(tok.decode(s.completion_ids.tolist(), skip_special_tokens=True) for s in theirs) == sorted(
        claimed for _, claimed in LIES)  # it trains on what the text claims, not on what the tokens say
    shares = update_shares(samples, influence, {"liar"})
    c = blind.cfg.objective.truncation_c
    # Per sample: its influence on the update over the influence the same text would have as an honest,
    # on-policy sample (weight 1). The liar's samples carried gradient (kept by the filter), each
    # weighted at most C: without the truncation its chunks' ratios (rho about e^4) would show.
    gains = [infl / unit for s, (infl, _, unit) in zip(samples, influence, strict=True)
             if s.source == "liar" and unit > 0]
    assert shares["attacker_kept"] >= 1 and gains and max(gains) <= c + 1e-6, (shares, gains)
    assert shares["weight_gain"] <= c + 1e-6
    print({"lying_text_weight_gain": round(shares["weight_gain"], 4), "per_sample": [round(g, 4) for g in gains],
           "bound_c": c,
           "share_of_step_update": round(shares["share"], 4), "kept": shares["attacker_kept"],
           "samples": shares["attacker_samples"]})
