"""Numerics a hostile peer cannot poison: the logprob floor, clamped log-ratios in every variant, a
non-finite step that drops the peer samples instead of raising, and refusals that survive a restart."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from protocol import validate as v
from protocol.codec import decode, encode
from protocol.messages import Completion, PromptRef, RolloutGroup, SamplingParams
from swarm_node.config import ObjectiveConfig, TrainConfig
from swarm_node.method.objective import LOG_RATIO_BOUND, ObjectiveInputs, objective_loss, per_sample_kl
from swarm_node.policy.trainer import Trainer
from swarm_node.peers.rejects import RejectList
from swarm_node.node.peer_rollouts import group_record_id
from tests.unit.test_policy_trainer import cache, make_policy, make_samples, params  # noqa: F401  (fixture)

VARIANTS = ("grpo", "nois", "vis", "tis", "f-nois", "f-vis", "f-tis")
LIMITS = v.ValidationLimits(vocab_size=100)


def wire_group(logprobs: tuple[float, ...], top_p: float = 1.0) -> RolloutGroup:
    comp = Completion(token_ids=np.arange(len(logprobs), dtype=np.uint32) + 1,
                      logprobs=np.asarray(logprobs, dtype=np.float32), finish_reason="stop", claimed_reward=1.0)
    return RolloutGroup(
        swarm_id="s", sender="peer", model_id="m", model_revision="", tokenizer_fingerprint="fp", policy_version=3,
        created_at=10.0, prompt=PromptRef(prompt_set_id="ps", index=2, sha256="ab" * 32),
        sampling=SamplingParams(temperature=1.0, top_p=top_p, max_new_tokens=16), completions=(comp, comp))


# ---- the logprob floor and the one logprob definition ----------------------------------------------

@pytest.mark.parametrize(("logprobs", "expected"), [
    ((-0.5, -49.9, -1.0), []),
    ((-0.5, -50.0, -1.0), []),  # the floor itself is allowed
    ((-0.5, -50.01, -1.0), [v.LOGPROB_BELOW_FLOOR]),
    ((-90.0, -0.1, -1.0), [v.LOGPROB_BELOW_FLOOR]),  # the value that crashed plain VIS
    ((-3.0e38, -0.1, -1.0), [v.LOGPROB_BELOW_FLOOR]),
])
def test_logprob_floor(logprobs: tuple[float, ...], expected: list[str]) -> None:
    assert v.MIN_LOGPROB == -50.0
    assert v.validate_group(decode(encode(wire_group(logprobs))), LIMITS) == expected


def test_floor_is_a_limit_and_top_p_below_one_is_refused() -> None:
    lax = dataclasses.replace(LIMITS, min_logprob=-100.0)
    assert v.validate_group(wire_group((-90.0, -1.0)), lax) == []
    assert v.validate_group(wire_group((-1.0, -1.0), top_p=0.9), LIMITS) == [v.UNSUPPORTED_TOP_P]
    assert v.LOGPROB_BELOW_FLOOR in v.GROUP_REASONS and v.UNSUPPORTED_TOP_P in v.GROUP_REASONS


# ---- every variant's ratio from clamped log-ratios -------------------------------------------------

EXTREMES = (v.MIN_LOGPROB, -1e4, -3.0e38, 0.0)  # the floor, and finite values far below it


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("gen_value", EXTREMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_variant_is_finite_for_extreme_finite_generator_logprobs(variant: str, gen_value: float,
                                                                       dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    b, t = 6, 5
    trainer = (-torch.rand(b, t, dtype=dtype) * 3 - 0.01).requires_grad_(True)
    old = trainer.detach() - 0.05
    gen = torch.full((b, t), gen_value, dtype=dtype)
    gen[0] = trainer.detach()[0]  # one own, on-policy row
    gen[1, 2] = -1e4 if dtype == torch.float64 else -3.0e38  # and one token far off in an otherwise extreme row
    inputs = ObjectiveInputs(
        trainer_logprobs=trainer, step_start_logprobs=old, generator_logprobs=gen,
        mask=torch.ones(b, t, dtype=torch.bool), advantages=torch.tensor([1.0, -1.0, 2.0, -0.5, 0.5, 1.5], dtype=dtype),
        is_peer=torch.tensor([False, True, True, True, True, True]),
        sample_weights=torch.full((b,), 1.0 / (b * t), dtype=torch.float64))
    cfg = ObjectiveConfig(variant=variant, kl_threshold=1e12)  # keep peers unfiltered: their ratios count
    loss, stats = objective_loss(inputs, cfg)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(trainer.grad).all()
    metrics = stats.to_dict()
    assert all(math.isfinite(x) for x in metrics.values()), {k: x for k, x in metrics.items() if not math.isfinite(x)}
    assert metrics["is_weight_max"] <= math.exp(LOG_RATIO_BOUND) * (1 + 1e-5)


def test_kl_of_an_extreme_sample_is_huge_but_finite() -> None:
    theta = torch.tensor([[-200.0, -1.0]])
    gen = torch.tensor([[-0.0, -1.0]])  # delta = +200 on the first token (log r = -200)
    mask = torch.ones(1, 2, dtype=torch.bool)
    kl = per_sample_kl(theta, gen, mask, estimator="k3_theta")
    assert math.isfinite(float(kl)) and float(kl) == pytest.approx(math.expm1(LOG_RATIO_BOUND) - LOG_RATIO_BOUND, rel=1e-6)
    # k3_gen = r - 1 - log r: linear in the clamped log-ratio on this side
    kl = per_sample_kl(theta, gen, mask, estimator="k3_gen")
    assert float(kl) == pytest.approx(math.expm1(-LOG_RATIO_BOUND) + LOG_RATIO_BOUND, rel=1e-6)
    # and the other side: pi_theta far above pi_gen
    kl = per_sample_kl(gen, theta, mask, estimator="k3_gen")
    assert math.isfinite(float(kl)) and float(kl) == pytest.approx(math.expm1(LOG_RATIO_BOUND) - LOG_RATIO_BOUND, rel=1e-6)


def test_clamp_changes_nothing_within_the_bound() -> None:
    """Ratios well inside the bound are exact: clamping is a numeric guard, not a new objective."""
    theta = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    gen = torch.tensor([[-3.0, -2.5]], dtype=torch.float64)
    inputs = ObjectiveInputs(trainer_logprobs=theta, step_start_logprobs=theta.detach(), generator_logprobs=gen,
                             mask=torch.ones(1, 2, dtype=torch.bool), advantages=torch.tensor([-1.0], dtype=torch.float64),
                             is_peer=torch.tensor([True]), sample_weights=torch.tensor([0.5], dtype=torch.float64))
    loss, _ = objective_loss(inputs, ObjectiveConfig(variant="vis"))
    # A < 0: min(R A, clip(R) A) = R A with R = e^2, e^0.5
    assert float(loss.detach()) == pytest.approx(0.5 * (math.exp(2.0) + math.exp(0.5)))


# ---- a non-finite step drops the peer samples instead of raising ----------------------------------

def test_nonfinite_peer_sample_drops_the_peers_and_trains_on_own(cache: Path) -> None:  # noqa: F811
    policy = make_policy(cache)
    own = make_samples(policy, [[1.0, 0.0]], seed=1)
    peers = make_samples(policy, [[0.0, 1.0], [1.0, 0.0]], peer=True, seed=2)
    lp = peers[1].generator_logprobs.copy()
    lp[0] = np.nan  # only a bypassed validator lets this through: the trainer is the last line
    poisoned = dataclasses.replace(peers[1], generator_logprobs=lp, source="peer-evil", record_id="r-evil")
    batch = own + [peers[0], poisoned] + peers[2:]
    start = params(policy)
    cfg = ObjectiveConfig(variant="tis")

    metrics = Trainer(policy, TrainConfig(learning_rate=1e-3), cfg, 1.0).step(batch)
    assert all(math.isfinite(x) for x in metrics.values())
    assert metrics["nonfinite_dropped_samples"] == 4 and metrics["nonfinite_senders"] == 1
    assert metrics["peer_samples"] == 0 and metrics["optimizer_steps"] == 1
    after_poisoned = params(policy)

    # The update equals a step on the own samples alone, from the same start.
    for name, p in policy.model.named_parameters():
        p.data.copy_(start[name])
    trainer = Trainer(policy, TrainConfig(learning_rate=1e-3), cfg, 1.0)
    trainer.step(own)
    assert trainer.poisoned == []
    for name, p in params(policy).items():
        assert torch.equal(p, after_poisoned[name]), name


def test_blame_falls_on_the_poisoned_micro_batch(cache: Path) -> None:  # noqa: F811
    policy = make_policy(cache)
    own = make_samples(policy, [[1.0, 0.0]], seed=1)
    peers = make_samples(policy, [[0.0, 1.0], [1.0, 0.0]], peer=True, seed=3)
    lp = peers[2].generator_logprobs.copy()
    lp[-1] = np.nan
    peers[2] = dataclasses.replace(peers[2], generator_logprobs=lp, source="peer-evil", record_id="r-evil")
    trainer = Trainer(policy, TrainConfig(learning_rate=1e-3, micro_batch_size=1), ObjectiveConfig(variant="vis"), 1.0)
    metrics = trainer.step(own + peers)
    # Blame is per micro-batch (here one sample): the honest peer samples are dropped from this
    # step but not blamed.
    assert [s.record_id for s in trainer.poisoned] == ["r-evil"]
    assert metrics["nonfinite_dropped_samples"] == 4 and metrics["nonfinite_senders"] == 1


def test_nonfinite_own_samples_still_raise(cache: Path) -> None:  # noqa: F811
    policy = make_policy(cache)
    own = make_samples(policy, [[1.0, 0.0]], seed=1)
    lp = own[0].generator_logprobs.copy()
    lp[0] = np.nan
    own[0] = dataclasses.replace(own[0], generator_logprobs=lp)
    with pytest.raises(FloatingPointError, match="non-finite"):
        Trainer(policy, TrainConfig(), ObjectiveConfig(variant="tis"), 1.0).step(own)


# ---- refusals that survive a restart ---------------------------------------------------------------

def test_reject_list_persists_atomically_and_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "rejected_records.json"
    rejects = RejectList(path, capacity=3)
    assert rejects.add("a", "nonfinite_step") and not rejects.add("a", "nonfinite_step")
    rejects.add_many([("b", "verifier_timeout"), ("c", "nonfinite_step"), ("d", "nonfinite_step")])
    assert "a" not in rejects and len(rejects) == 3  # the oldest is forgotten
    reloaded = RejectList(path, capacity=3)
    assert {"b", "c", "d"} == {k for k in "abcd" if k in reloaded}
    assert reloaded.reason("b") == "verifier_timeout"
    assert not list(tmp_path.glob("*.tmp*"))  # no temporary file left behind
    assert json.loads(path.read_text())["format"] == 1


def test_unreadable_reject_list_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "rejected_records.json"
    path.write_text("{ not json")
    assert len(RejectList(path)) == 0


def test_record_id_is_a_content_id() -> None:
    g = wire_group((-0.5, -1.0))
    assert group_record_id(g) == group_record_id(decode(encode(g)))
    lp = np.asarray((-0.5, -1.5), dtype=np.float32)
    changed = dataclasses.replace(g, completions=(dataclasses.replace(g.completions[0], logprobs=lp), g.completions[1]))
    assert group_record_id(changed) != group_record_id(g)
    assert group_record_id(dataclasses.replace(g, sender="other")) != group_record_id(g)
    # Text is part of the content: another text for the same tokens is another record.
    def texted(text: str) -> RolloutGroup:
        return dataclasses.replace(g, completions=tuple(
            dataclasses.replace(c, text=text, piece_bytes=[len(text)] + [0] * (c.token_ids.shape[0] - 1))
            for c in g.completions))
    assert group_record_id(texted("4")) == group_record_id(decode(encode(texted("4"))))
    assert len({group_record_id(g), group_record_id(texted("4")), group_record_id(texted("5"))}) == 3


# ---- through the node loop: the attacks as a peer mounts them --------------------------------------

def _tamper_logprobs(node, value: float) -> None:
    """Make `node` publish groups whose every logprob is `value` (a hostile peer's groups)."""
    generate = node.parts.generator.generate

    def hostile(prompt_ids, n):
        out = generate(prompt_ids, n)
        return [[dataclasses.replace(c, logprobs=np.full_like(c.logprobs, value)) for c in group] for group in out]

    node.parts.generator.generate = hostile


@pytest.mark.parametrize(("value", "used"), [(-90.0, False), (-20.0, True)])
def test_vis_node_survives_extreme_peer_logprobs(tmp_path: Path, value: float, used: bool) -> None:
    from swarm_node.swarm.memory import MemorySwarm
    from tests.unit.test_node_loop import make_node

    swarm = MemorySwarm()
    evil = make_node(tmp_path, swarm, "evil")
    _tamper_logprobs(evil, value)
    # Both nodes hold the same untrained model, so a spot-check would drop the forged group as
    # logprob_mismatch (test_spotcheck.py); this test is about the numerics of one that gets through.
    honest = make_node(tmp_path, swarm, "honest", extra=['objective.variant="vis"', "swarm.spot_check.enabled=false"])
    evil.run_step()
    m = honest.run_step()
    assert all(math.isfinite(x) for x in m.values())
    if used:  # above the floor: accepted, trained on, finite
        assert m["peer_samples"] > 0 and m["is_weight_max"] > 1e6
    else:
        assert m["peer_samples"] == 0 and m["dropped_logprob_below_floor"] >= 1


def test_a_group_blamed_for_a_nonfinite_step_stays_refused_after_restart(tmp_path: Path) -> None:
    from swarm_node.swarm.memory import MemorySwarm
    from tests.unit.test_node_loop import make_node

    swarm = MemorySwarm()
    evil = make_node(tmp_path, swarm, "evil")
    evil.run_step()
    honest = make_node(tmp_path, swarm, "honest")
    step = honest.parts.trainer.step

    def blame_every_peer(samples):  # stands in for a step whose peer samples went non-finite
        metrics = step(samples)
        honest.parts.trainer.poisoned = [s for s in samples if s.is_peer]
        return metrics

    honest.parts.trainer.step = blame_every_peer
    m = honest.run_step()
    assert m["peer_groups"] >= 1 and m["dropped_nonfinite_step"] == m["peer_groups"]
    saved = json.loads((tmp_path / "honest" / "rejected_records.json").read_text())["records"]
    assert len(saved) == m["peer_groups"]

    restarted = make_node(tmp_path, swarm, "honest")  # a fresh process: nothing remembered in memory
    m2 = restarted.run_step()
    assert m2["peer_groups"] == 0 and m2["dropped_rejected_before"] == len(saved)
