"""The config tree: TOML plus dotted overrides, validation, and the resolved dump."""

from __future__ import annotations

import pytest

from swarm_node.config import NodeConfig
from swarm_node.config.toml_text import apply_override


def test_overrides_parse_toml_values_and_bare_words():
    data: dict = {}
    apply_override(data, "train.learning_rate=3e-5")
    apply_override(data, "swarm.initial_peers=[\"/ip4/1.2.3.4/tcp/1/p2p/QmX\"]")
    apply_override(data, "model.name=smollm2-135m")
    cfg = NodeConfig.model_validate(data)
    assert cfg.train.learning_rate == 3e-5
    assert cfg.swarm.initial_peers == ["/ip4/1.2.3.4/tcp/1/p2p/QmX"]
    assert cfg.model.name == "smollm2-135m"


@pytest.mark.parametrize("item", ["no_equals_sign", "a..b=1", 'model.name="unterminated', "x.y=[1, 2"])
def test_bad_overrides_are_refused_with_a_reason(item):
    with pytest.raises(ValueError):
        apply_override({}, item)


def test_unknown_fields_and_out_of_range_values_are_refused():
    with pytest.raises(ValueError, match="learning_rat"):
        NodeConfig.load(None, ["train.learning_rat=1e-5"])
    with pytest.raises(ValueError, match="truncation_c"):
        NodeConfig.load(None, ["objective.truncation_c=-1"])
    with pytest.raises(ValueError, match="task.source is required"):
        NodeConfig.load(None, ['task.name="gsm8k"'])
    with pytest.raises(ValueError, match="isolated baseline"):
        NodeConfig.load(None, ['objective.variant="grpo"'])
    # Peers with the same settings would drop this node's groups as unsupported_temperature.
    with pytest.raises(ValueError, match="unsupported_temperature"):
        NodeConfig.load(None, ["generation.temperature=3.0"])
    NodeConfig.load(None, ["generation.temperature=3.0", "swarm.enabled=false"])
    with pytest.raises(ValueError, match="min_peer_temperature"):
        NodeConfig.load(None, ["swarm.min_peer_temperature=1.5", "swarm.max_peer_temperature=1.0"])


def test_resolved_dump_loads_back_identically(tmp_path):
    cfg = NodeConfig.load(None, ["model.lora.enabled=true", 'swarm.collaboration="horizontal"', "train.betas=[0.8, 0.9]"])
    path = tmp_path / "resolved.toml"
    path.write_text(cfg.dump_toml())
    assert NodeConfig.load(path) == cfg
