"""What each run of an experiment trains with: a (node, arm, seed) of an `ExperimentSpec` as the
production `NodeConfig` (`node_config`, nothing else: a run is a node as `swarm-node join` would
configure it), a horizontal arm's split of each group (`horizontal_parts`), and the held-out task
(`eval_task`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from swarm_node.config import GenerationConfig, NodeConfig, SwarmConfig, TaskConfig, TrainConfig
from swarm_node.config.toml_text import apply_override
from swarm_node.experiment.spec import ArmSpec, ExperimentSpec, NodeSpec

__all__ = ["eval_task", "horizontal_parts", "node_config"]


def node_config(spec: ExperimentSpec, node: NodeSpec, arm: ArmSpec, seed: int, node_index: int,
                node_dir: Path, model_name: str | None = None, pair_size: int = 1) -> NodeConfig:
    """The production NodeConfig of `node` in `arm` for `seed` (model_name: a warm model's directory;
    pair_size: the nodes of the pair, who share a horizontal arm's groups)."""
    data: dict[str, Any] = json.loads(json.dumps(spec.defaults))
    data["node_dir"] = str(node_dir)
    model = data.setdefault("model", {})
    model["name"] = model_name or node.model
    model.setdefault("cache_dir", str(spec.experiment.cache_dir.expanduser() / "models"))
    if node.lora is not None:
        model.setdefault("lora", {})["enabled"] = node.lora
    train = data.setdefault("train", {})
    if node.learning_rate is not None:
        train["learning_rate"] = node.learning_rate
    train["total_steps"] = spec.experiment.steps
    train["prompts_per_step"] = arm.own_budget * int(
        train.get("prompts_per_step", TrainConfig.model_fields["prompts_per_step"].default))
    train["seed"] = seed * 1009 + node_index  # nodes of a run differ; arms of a seed agree
    if node.temperature is not None:
        data.setdefault("generation", {})["temperature"] = node.temperature
    if node.levels is not None:
        data.setdefault("task", {})["levels"] = node.levels
    data.setdefault("eval", {}).setdefault("problems", 0)  # the experiment evaluates its checkpoints itself
    swarm = data.setdefault("swarm", {})
    swarm["swarm_id"] = f"exp-s{seed}"  # salts prompt selection: the same prompts in every arm of a seed
    swarm["collaboration"] = arm.collaboration
    # A lagged group must still be admitted (staleness) and stored (TTL) when it arrives, lag + 1 windows
    # after it was made: both only rise, so grids without a lag keep their settings.
    lag = spec.peer_lag(arm)
    fields = SwarmConfig.model_fields
    swarm["staleness_steps"] = max(int(swarm.get("staleness_steps", fields["staleness_steps"].default)), lag + 1)
    window = float(swarm.get("window_seconds", fields["window_seconds"].default))
    ttl = float(swarm.get("record_ttl_s", fields["record_ttl_s"].default))
    swarm["record_ttl_s"] = max(ttl, (swarm["staleness_steps"] + 2) * window)
    objective = data.setdefault("objective", {})
    objective.pop("variant", None)  # the arm names the loss (as it always did, also over an old `variant`)
    if arm.isolated:  # on-policy GRPO: the swarm off and no peer samples
        swarm["enabled"] = False
        swarm["max_peer_fraction"] = 0.0
        objective["correction"], objective["filter"] = "none", "off"
    else:
        swarm["enabled"] = True
        objective["correction"], objective["filter"] = arm.correction, arm.filter
    for item in [*node.set, *arm.set]:
        apply_override(data, item)
    if not arm.isolated and arm.collaboration == "horizontal":
        horizontal_parts(data, pair_size)
    return NodeConfig.model_validate(data)


def horizontal_parts(data: dict[str, Any], n: int) -> None:
    """A horizontal arm's node config (in place): of a group of G = `generation.group_size` on each of
    n x P shared prompts (P = `train.prompts_per_step`), each of the n nodes generates G/n, so its own
    budget stays P x G and each group of its batch is the union of n parts (docs/method.md, horizontal).
    The peer caps rise to what the union needs (the other nodes' n x P parts each, (n-1)/n of the
    groups), so that no part of a shared group is left out; a peer's share is scaled by its
    reputation weight, at least 1 / (1 + trusted_after) for a fresh identity, so the per-peer cap
    is n x P over that weight (`swarm.admission.fair_sample`)."""
    from swarm_node.swarm.admission import Reputation

    gen, train, swarm = data.setdefault("generation", {}), data.setdefault("train", {}), data["swarm"]
    group = int(gen.get("group_size", GenerationConfig.model_fields["group_size"].default))
    prompts = int(train.get("prompts_per_step", TrainConfig.model_fields["prompts_per_step"].default))
    if group % n:
        raise ValueError(f"a horizontal arm splits each group of G = {group} among {n} nodes: G must be a multiple of {n}")
    gen["group_size"] = group // n
    train["prompts_per_step"] = prompts * n
    caps = SwarmConfig.model_fields
    per_peer = math.ceil(n * prompts * (1.0 + Reputation().trusted_after))
    for key, need in (("max_peer_groups_per_step", (n - 1) * n * prompts), ("max_groups_per_peer", per_peer),
                      ("max_peer_fraction", (n - 1) / n)):
        swarm[key] = max(swarm.get(key, caps[key].default), need)


def eval_task(spec: ExperimentSpec) -> TaskConfig:
    return TaskConfig.model_validate(spec.eval.task)
