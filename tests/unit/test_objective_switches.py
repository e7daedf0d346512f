"""The loss as two switches: every old `objective.variant` name loads to its (correction, filter) pair
and gives the same loss and gradient as that pair written out; settings that disagree are refused."""

from __future__ import annotations

import itertools

import pytest
import torch

from swarm_node.config import NodeConfig, ObjectiveConfig
from swarm_node.util.errors import describe
from swarm_node.experiment.spec import ArmSpec
from swarm_node.method.objective import ObjectiveInputs, group_advantages, objective_loss, sample_weights
from tests.unit.naive_objective import naive_loss_and_grad, random_batch

# The mapping as the paper's table states it, written out here rather than read from the code.
OLD_NAMES = {
    "grpo": ("none", "off"), "nois": ("none", "off"), "vis": ("vis", "off"), "tis": ("tis", "off"),
    "f-nois": ("none", "on"), "f-vis": ("vis", "on"), "f-tis": ("tis", "on"),
}
# g low enough that the KL filter drops some peers' samples of the random batches, and not all.
SETTINGS = {"kl_threshold": 1.5, "truncation_c": 1.3, "filter_scope": "peers"}
SEEDS = range(3)


def loss_and_grad(cfg: ObjectiveConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and gradient on a fixed random batch with peers' samples, in a later epoch (R != 1)."""
    t = random_batch(seed)["tensors"]
    trainer = t["trainer"].clone().requires_grad_(True)
    inputs = ObjectiveInputs(
        trainer_logprobs=trainer, step_start_logprobs=t["step_start"], generator_logprobs=t["generator"],
        mask=t["mask"], advantages=group_advantages(t["rewards"], t["group_ids"]), is_peer=t["is_peer"],
        sample_weights=sample_weights(t["group_ids"], t["mask"].sum(1)))
    loss, _ = objective_loss(inputs, cfg)
    loss.backward()
    return loss.detach(), trainer.grad


@pytest.mark.parametrize("name", sorted(OLD_NAMES))
def test_every_old_name_loads_to_its_two_switches(name):
    correction, filter_ = OLD_NAMES[name]
    old = ObjectiveConfig(variant=name)
    assert (old.correction, old.filter, old.variant_name) == (correction, filter_, name)
    peers = ["swarm.max_peer_fraction=0"] if name == "grpo" else []  # grpo: the isolated baseline
    from_file = NodeConfig.load(None, [f'objective.variant="{name}"', *peers])
    written_out = NodeConfig.load(None, [f'objective.correction="{correction}"', f'objective.filter="{filter_}"', *peers])
    assert from_file.objective.model_dump(exclude={"variant"}) == written_out.objective.model_dump(exclude={"variant"})
    assert written_out.objective.variant is None
    # The resolved dump of an old-form config reloads (variant and switches agree).
    assert NodeConfig.model_validate(from_file.model_dump()).objective == from_file.objective


@pytest.mark.parametrize("name", sorted(OLD_NAMES))
def test_every_old_name_gives_the_loss_of_its_switches(name):
    correction, filter_ = OLD_NAMES[name]
    old = ObjectiveConfig(variant=name, **SETTINGS)
    new = ObjectiveConfig(correction=correction, filter=filter_, **SETTINGS)
    for seed in SEEDS:
        old_loss, old_grad = loss_and_grad(old, seed)
        new_loss, new_grad = loss_and_grad(new, seed)
        assert torch.equal(old_loss, new_loss) and torch.equal(old_grad, new_grad)  # bitwise
        # ... and both are the naive reference's loss for the old name
        ref_loss, ref_grad = naive_loss_and_grad(
            random_batch(seed)["naive"], name, c=SETTINGS["truncation_c"], eps=new.clip_eps, g=SETTINGS["kl_threshold"],
            kl_reduction=new.kl_reduction, kl_estimator=new.kl_estimator, filter_rule=new.filter_rule, scope="peers",
            normalization=new.normalization, scale_by_std=new.scale_by_std, adv_eps=new.advantage_eps)
        assert float(new_loss) == pytest.approx(ref_loss, rel=1e-6, abs=1e-12)
        mask = random_batch(seed)["tensors"]["mask"]
        assert torch.allclose(new_grad[mask], torch.tensor(ref_grad, dtype=new_grad.dtype)[mask], rtol=1e-6, atol=1e-12)


def test_each_switch_changes_the_loss():
    """The six pairs give six different losses on a batch with peers' samples, so the equalities above
    would fail for a name mapped to the wrong pair."""
    pairs = list(itertools.product(("none", "vis", "tis"), ("on", "off")))
    losses = {p: float(loss_and_grad(ObjectiveConfig(correction=p[0], filter=p[1], **SETTINGS), 0)[0]) for p in pairs}
    assert len({round(v, 12) for v in losses.values()}) == 6, losses


def test_disagreeing_settings_are_refused_in_one_line():
    for name, (correction, filter_) in OLD_NAMES.items():  # agreeing settings load
        assert ObjectiveConfig(variant=name, correction=correction, filter=filter_).variant_name == name
    with pytest.raises(ValueError) as info:
        NodeConfig.load(None, ['objective.variant="f-tis"', 'objective.correction="vis"'])
    err = describe(info.value)
    assert err is not None and "\n" not in str(err)
    assert "objective.variant='f-tis' means correction='tis', filter='on'" in str(err)
    assert "objective.correction='vis' is set" in str(err)
    with pytest.raises(ValueError, match="objective.filter='on' is set"):
        ObjectiveConfig(variant="nois", filter="on")
    cfg = ObjectiveConfig(variant="f-tis")
    with pytest.raises(ValueError, match="set only objective.correction"):  # assignment is checked too
        cfg.filter = "off"
    assert cfg.filter == "on"


def test_grpo_stays_the_isolated_baseline():
    with pytest.raises(ValueError, match="isolated baseline"):
        NodeConfig.load(None, ['objective.variant="grpo"'])
    assert NodeConfig.load(None, ['objective.variant="grpo"', "swarm.enabled=false"]).objective.variant_name == "grpo"
    alone = NodeConfig.load(None, ['objective.variant="grpo"', "swarm.max_peer_fraction=0"])
    assert (alone.objective.correction, alone.objective.filter) == ("none", "off")
    # The same switches with peers are NoIS, which is allowed.
    nois = NodeConfig.load(None, ['objective.correction="none"', 'objective.filter="off"'])
    assert nois.swarm.max_peer_fraction > 0 and nois.objective.variant_name == "nois"


def test_experiment_arms_read_the_old_names():
    assert ArmSpec(name="a", variant="isolated") == ArmSpec(name="a", isolated=True)
    for name, (correction, filter_) in OLD_NAMES.items():
        if name == "grpo":
            with pytest.raises(ValueError, match="not an arm's variant"):
                ArmSpec(name="a", variant=name)
            continue
        arm = ArmSpec(name="a", variant=name)
        assert arm == ArmSpec(name="a", correction=correction, filter=filter_) and arm.variant_name == name
    with pytest.raises(ValueError, match="means correction='tis', filter='on'"):
        ArmSpec(name="a", variant="f-tis", filter="off")
    with pytest.raises(ValueError, match="drop its correction and filter"):
        ArmSpec(name="a", isolated=True, correction="tis", filter="on")
    with pytest.raises(ValueError, match="disagree"):
        ArmSpec(name="a", variant="isolated", isolated=False)


def test_an_arm_names_the_loss_over_an_old_default(tmp_path):
    from swarm_node.experiment.spec import ExperimentSpec
    from swarm_node.experiment.configs import node_config

    spec = ExperimentSpec.model_validate({
        "defaults": {"objective": {"variant": "f-tis", "kl_threshold": 5.0}},
        "nodes": [{"name": "a", "model": "tiny-random:32x1"}],
        "arms": [{"name": "isolated", "variant": "isolated"}, {"name": "vis", "correction": "vis", "filter": "off"}]})
    iso, vis = (node_config(spec, spec.node("a"), arm, 0, 0, tmp_path / arm.name) for arm in spec.arms)
    assert (iso.objective.correction, iso.objective.filter, iso.objective.variant) == ("none", "off", None)
    assert (vis.objective.variant_name, vis.objective.kl_threshold, vis.swarm.enabled) == ("vis", 5.0, True)
    assert not iso.swarm.enabled and iso.swarm.max_peer_fraction == 0
