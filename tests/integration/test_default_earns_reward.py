"""The embedded default, configured as `swarm-node local` configures it, earns reward as shipped:
real SmolLM2-135M, real generation, the real one-answer reward (no fakes)."""

from __future__ import annotations

import pytest

from swarm_node.node.assemble import build_parts
from swarm_node.ops.local import node_config, plan_nodes
from swarm_node.node.loop import Node

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # ~1-2 min: two steps of the 135M model


def test_embedded_default_has_a_mixed_group_within_two_steps(tmp_path):
    shared, nodes = plan_nodes(None, None)
    cfg = node_config(shared, nodes[0], 0, tmp_path, 2, [], ["swarm.enabled=false", "swarm.max_peer_fraction=0.0"])
    assert cfg.model.name == "smollm2-135m" and cfg.task.worked_example  # the shipped defaults
    parts, start = build_parts(cfg)
    node = Node(parts, start_step=start)
    node.run()
    assert node.step == 2
    assert any(m["mixed_groups"] > 0 for m in node.history), node.history
    assert sum(m["reward_mean"] for m in node.history) > 0
    assert any(m["grad_norm"] > 0 for m in node.history)  # a mixed group is a gradient: the node learns
