"""Horizontal collaboration in lockstep (docs/method.md): the nodes of an arm generate parts of
the same prompts' groups in the same step, and each node's groups are the union of the parts."""

from __future__ import annotations

from collections import defaultdict

import pytest

from swarm_node.experiment.lockstep import run_lockstep
from swarm_node.experiment.spec import ExperimentSpec
from swarm_node.experiment.configs import node_config
from swarm_node.policy.trainer import Trainer

SPEC = """
[experiment]
name = "horizontal"
seeds = [0]
steps = 2
cache_dir = "{cache}"
[eval]
every = 2
problems = 4
[defaults]
generation = {{ group_size = 4, max_new_tokens = 6 }}
train = {{ prompts_per_step = 2, micro_batch_size = 4, learning_rate = 0.01 }}
task = {{ name = "arithmetic", levels = [1], size = 50 }}
swarm = {{ max_peer_groups_per_step = 1, max_groups_per_peer = 1 }}
[[nodes]]
name = "a"
model = "tiny-random:32x1"
[[nodes]]
name = "b"
model = "tiny-random:64x1"
[[arms]]
name = "f-tis-horizontal"
variant = "f-tis"
collaboration = "horizontal"
"""


@pytest.fixture()
def spec(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(SPEC.format(cache=tmp_path / "cache"))
    return ExperimentSpec.load(path)


def configs(spec, tmp_path):
    arm = spec.arms[0]
    return [(n.name, node_config(spec, n, arm, 0, i, tmp_path / n.name, n.model, pair_size=2))
            for i, n in enumerate(spec.nodes)]


def test_horizontal_arm_splits_each_group_and_keeps_the_own_budget(spec, tmp_path):
    for _, cfg in configs(spec, tmp_path):
        assert cfg.generation.group_size == 2 and cfg.train.prompts_per_step == 4  # G/2 on 2 x P prompts
        assert cfg.generation.group_size * cfg.train.prompts_per_step == 4 * 2  # own budget P x G unchanged
        # the caps the file set (1) would leave parts out: raised to the other node's 4 parts (per peer:
        # over a fresh identity's reputation weight 1/4, `fair_sample`)
        assert cfg.swarm.max_peer_groups_per_step == 4 and cfg.swarm.max_groups_per_peer == 16
        assert cfg.swarm.max_peer_fraction == 0.5
    with pytest.raises(ValueError, match="G must be a multiple of 3"):
        node_config(spec, spec.nodes[0], spec.arms[0], 0, 0, tmp_path / "x", "tiny-random:32x1", pair_size=3)


def test_lockstep_horizontal_halves_merge_into_groups_of_g(spec, tmp_path, monkeypatch):
    batches: dict[int, list[list]] = defaultdict(list)  # trainer -> per step: (group key, source, prompt)
    step = Trainer.step

    def spy(self, samples):
        batches[id(self)].append([(s.group_key, s.source, s.prompt_ids.tobytes()) for s in samples])
        return step(self, samples)

    monkeypatch.setattr(Trainer, "step", spy)
    run_lockstep(configs(spec, tmp_path), steps=2, peer_lag=0, seed=0, evaluate=lambda *a: {"accuracy": 0.0},
                 eval_every=2, run_dir=tmp_path, log=lambda m: None)
    assert len(batches) == 2 and all(len(steps) == 2 for steps in batches.values())
    for r in range(2):
        keys_by_node = []
        for (name, other), steps in zip((("a", "b"), ("b", "a")), batches.values(), strict=True):
            groups = defaultdict(list)
            for key, source, prompt in steps[r]:
                groups[key].append((source, prompt))
            assert len(groups) == 4  # the 2 x 2 shared prompts of the round
            for members in groups.values():
                sources = sorted(src for src, _ in members)
                assert sources == sorted(["self", "self", other, other])  # G = 4: two own, two the peer's
                assert len({p for _, p in members}) == 1  # one prompt per group
            keys_by_node.append(set(groups))
        assert keys_by_node[0] == keys_by_node[1]  # both nodes train on the same groups
    # two rounds, two windows: other prompts in the second round
    first = {k for k, _, _ in next(iter(batches.values()))[0]}
    second = {k for k, _, _ in next(iter(batches.values()))[1]}
    assert first != second


def test_horizontal_lockstep_refuses_peer_lag(spec, tmp_path):
    with pytest.raises(ValueError, match="need experiment.peer_lag = 0"):
        ExperimentSpec.model_validate({**spec.model_dump(), "experiment": {**spec.experiment.model_dump(),
                                                                           "peer_lag": 1}})
    with pytest.raises(ValueError, match="needs peer_lag = 0"):
        run_lockstep(configs(spec, tmp_path), steps=1, peer_lag=1, seed=0, evaluate=lambda *a: {"accuracy": 0.0},
                     eval_every=1, run_dir=tmp_path, log=lambda m: None)
