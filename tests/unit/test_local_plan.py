"""`swarm-node local` plans its nodes and its bootstrap replica before starting anything."""

from __future__ import annotations

import pytest

from swarm_node.util.errors import ConfigError
from swarm_node.ops.local import node_config, bootstrap_swarm_config, plan_nodes


def _configs(tmp_path, overrides=(), per_node=None, eval_problems=64):
    shared, nodes = plan_nodes(None, None)
    if per_node is not None:
        for node, extra in zip(nodes, per_node, strict=True):
            node["set"] = [*node["set"], *extra]
    return [node_config(shared, n, i, tmp_path, 4, [], list(overrides), eval_problems) for i, n in enumerate(nodes)]


def test_bootstrap_replica_shares_the_nodes_schedule(tmp_path):
    """A replica with another window length or staleness refuses honest records as off_schedule."""
    configs = _configs(tmp_path, ["swarm.window_seconds=45.0", "swarm.staleness_steps=6"])
    boot = bootstrap_swarm_config(configs)
    assert (boot.swarm_id, boot.window_seconds, boot.staleness_steps) == ("swarm-node-default", 45.0, 6)
    assert boot.initial_peers == [] and boot.host_maddrs == ["/ip4/127.0.0.1/tcp/0"]
    assert boot.max_subkeys_per_key == configs[0].swarm.max_subkeys_per_key


def test_nodes_that_disagree_on_the_schedule_are_refused(tmp_path):
    configs = _configs(tmp_path, per_node=[[], ["swarm.window_seconds=20.0"]])
    with pytest.raises(ConfigError, match="nodes disagree on swarm.window_seconds"):
        bootstrap_swarm_config(configs)


def test_local_defaults_evaluate_and_show_the_worked_example(tmp_path):
    configs = _configs(tmp_path)
    assert all(c.eval.problems == 64 and c.task.worked_example for c in configs)
    assert [c.eval.problems for c in _configs(tmp_path, eval_problems=0)] == [0, 0]
    gsm = _configs(tmp_path, ['task.name="gsm8k"', 'task.source="x.jsonl"'])
    assert [c.eval.problems for c in gsm] == [0, 0]  # no built-in held-out set: evaluation is off
