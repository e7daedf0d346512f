"""Docs cannot drift: every example and deploy config validates, compose and Dockerfile refer to
files that exist, and the researcher's metric table lists every canonical metric name."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from swarm_node import metric_names as m
from swarm_node.config import NodeConfig

ROOT = Path(__file__).resolve().parents[2]
NODE_CONFIGS = sorted(p for p in (ROOT / "examples" / "paper_gpu_replication").glob("*.toml")
                      if p.name != "experiment.toml") + [ROOT / "deploy" / "node.toml"]  # experiment.toml: an experiment file
SECTIONS = set(NodeConfig.model_fields)


@pytest.mark.parametrize("path", NODE_CONFIGS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_node_config_validates(path):
    cfg = NodeConfig.load(path)
    assert (cfg.objective.correction, cfg.objective.filter, cfg.objective.variant) == ("tis", "on", None)
    NodeConfig.model_validate(tomllib.loads(cfg.dump_toml()))  # the resolved dump reloads


def test_paper_replication_nodes():
    d = ROOT / "examples" / "paper_gpu_replication"
    cfgs = {p.stem: NodeConfig.load(p) for p in d.glob("qwen*.toml")}
    assert {c.model.name for c in cfgs.values()} == {
        "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-Coder-1.5B", "Qwen/Qwen2.5-Coder-3B"}
    for name, c in cfgs.items():
        assert c.node_dir == Path(f"./nodes/{name}")
        assert (c.task.name, c.generation.group_size, c.train.learning_rate) == ("gsm8k", 12, 1e-6)
        assert (c.objective.truncation_c, c.objective.clip_eps, c.objective.kl_threshold) == (2.0, 0.2, 50.0)
    assert len({c.train.seed for c in cfgs.values()}) == 4
    # the README's eval and baseline overrides are valid against the same files
    any_cfg = d / "qwen2.5-3b.toml"
    ev = NodeConfig.load(any_cfg, ["task.name=math500", "task.source=HuggingFaceH4/MATH-500", "task.split=test"])
    assert (ev.task.name, ev.task.source) == ("math500", "HuggingFaceH4/MATH-500")
    iso = NodeConfig.load(any_cfg, ["swarm.enabled=false", "objective.correction=none", "objective.filter=off"])
    nois = NodeConfig.load(any_cfg, ["objective.correction=none", "objective.filter=off"])
    assert (iso.objective.variant_name, nois.objective.variant_name, nois.swarm.enabled) == ("nois", "nois", True)
    assert NodeConfig.load(any_cfg, ["objective.correction=vis"]).objective.variant_name == "f-vis"
    assert NodeConfig.load(any_cfg, ["objective.filter=off"]).objective.variant_name == "tis"
    with pytest.raises(ValueError, match="set only objective.correction and objective.filter"):
        NodeConfig.load(any_cfg, ["swarm.enabled=false", "objective.variant=grpo"])  # the file sets tis, on
    NodeConfig.load(any_cfg, ["metrics.prometheus_addr=0.0.0.0:9401", "model.lora.enabled=true"])


def local_node_configs(path: Path) -> dict[str, NodeConfig]:
    """Resolve the local swarm file with the loader `swarm-node local` uses."""
    from swarm_node.ops.local import node_config, plan_nodes

    shared, per_node = plan_nodes(2, path)
    for node in per_node:
        assert set(node) <= {"name", "set"}, f"[[node]] {node}: unknown keys"
    peers = ["/ip4/127.0.0.1/tcp/1/p2p/QmZGKCaWuyavctPW61FfXeT86Y4s5jMJ6j13J1BVRP6Rop"]
    return {node["name"]: node_config(shared, node, i, Path("runs/test"), 6, peers, [])
            for i, node in enumerate(per_node)}


def test_local_cpu_swarm_file():
    cfgs = local_node_configs(ROOT / "examples" / "local_cpu_swarm.toml")
    assert list(cfgs) == ["full", "lora"]
    assert not cfgs["full"].model.lora.enabled and cfgs["lora"].model.lora.enabled
    assert all(c.model.name == "smollm2-135m" and c.task.name == "arithmetic" for c in cfgs.values())
    assert cfgs["lora"].train.learning_rate > cfgs["full"].train.learning_rate
    # the file writes out the command's defaults: resolving it changes nothing
    from swarm_node.ops.local import DEFAULT_NODES, node_config, plan_nodes

    shared, per_node = plan_nodes(2, None)
    assert per_node == DEFAULT_NODES
    peers = ["/ip4/127.0.0.1/tcp/1/p2p/QmZGKCaWuyavctPW61FfXeT86Y4s5jMJ6j13J1BVRP6Rop"]
    defaults = {n["name"]: node_config(shared, n, i, Path("runs/test"), 6, peers, []) for i, n in enumerate(per_node)}
    assert {k: v.model_dump() for k, v in cfgs.items()} == {k: v.model_dump() for k, v in defaults.items()}


def test_compose_services_and_files():
    text = (ROOT / "deploy" / "compose.yaml").read_text()
    doc = yaml.safe_load(text)
    assert set(doc["services"]) == {"bootstrap-identity", "bootstrap", "node-a", "node-b", "dashboard"}
    peer = "/ip4/172.28.0.10/tcp/31337/p2p/${BOOTSTRAP_PEER_ID:-SET-BOOTSTRAP_PEER_ID-IN-deploy.env}"
    for name in ("node-a", "node-b", "dashboard"):
        cmd = doc["services"][name]["command"]
        assert cmd[cmd.index("--initial-peer") + 1] == peer, name
    assert doc["services"]["bootstrap"]["networks"]["swarm"]["ipv4_address"] == "172.28.0.10"
    for svc in doc["services"].values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (ROOT / "deploy" / src).exists(), src
    assert doc["services"]["node-b"]["command"].count("--set=model.lora.enabled=true") == 1


def test_dockerfile_copy_sources_exist_and_ignore_keeps_them():
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    ignored = [x.strip() for x in (ROOT / ".dockerignore").read_text().splitlines() if x.strip() and not x.startswith("#")]
    sources = []
    for line in lines:
        if line.startswith("COPY "):
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            sources += parts[:-1]
    assert {"pyproject.toml", "README.md", "protocol", "swarm_node", "deploy/bootstrap_identity.py"} <= set(sources)
    for src in sources:
        assert (ROOT / src).exists(), f"Dockerfile COPY source {src} is missing"
        assert not any(src == pat or src.startswith(pat.rstrip("/") + "/") for pat in ignored), src
    assert any(line.startswith("ENTRYPOINT") and "swarm-node" in line for line in lines)
    assert re.search(r"^ARG VARIANT=cpu$", "\n".join(lines), re.M)


def test_researcher_doc_lists_every_metric():
    doc = (ROOT / "examples" / "researcher_watch.md").read_text()
    for name in m.METRICS:
        assert f"`{name}`" in doc, name
    assert "`dropped_<reason>`" in doc and "swarm_node_dropped_total" in doc


def test_bootstrap_identity_is_stable(tmp_path):
    pytest.importorskip("hivemind")
    import importlib.util

    spec = importlib.util.spec_from_file_location("bootstrap_identity", ROOT / "deploy" / "bootstrap_identity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path / "keys" / "bootstrap.id"
    first = mod.ensure_identity(path)
    assert first == mod.ensure_identity(path) and len(first) > 40
    assert path.stat().st_mode & 0o077 == 0


def _experiment(name: str):
    from swarm_node.experiment.spec import ExperimentSpec

    return ExperimentSpec.load(ROOT / "examples" / name)


def test_crosstok_long_assignments_and_reference_share_seeds():
    """Claim 1d (issue 42): both tokenizer assignments and the same-tokenizer references run on the same
    fresh seeds, with 1a's nodes and settings, so the crossing cost is a paired number."""
    from swarm_node.experiment.spec import parse_contrast

    spec, one_a = _experiment("sandbox_crosstok_long.toml"), _experiment("sandbox_power_long.toml")
    base = {n.name: n.warmup["base"] for n in spec.nodes}
    pairs = {p.name: p for p in spec.pairs}
    assert [base[n] for n in pairs["cross-a"].nodes] == ["tiny-random:64x2", "tiny-random:64x2:c"]  # add on bytes
    assert [base[n] for n in pairs["cross-b"].nodes] == ["tiny-random:64x2:c", "tiny-random:64x2"]  # the mirror
    assert pairs["same-bytes"].nodes == one_a.pairs[0].nodes == ["add-spec", "sub-spec"]
    for name in ("add-spec", "sub-spec"):  # the 1a nodes themselves
        assert spec.node(name) == one_a.node(name)
    for role in ("add", "sub"):  # the BPE specialists differ from the byte ones by the tokenizer only
        byte, bpe = spec.node(f"{role}-spec"), spec.node(f"{role}-spec-bpe")
        assert {**bpe.warmup, "base": byte.warmup["base"]} == byte.warmup and bpe.weak_skill == byte.weak_skill
    assert {k: v for k, v in spec.defaults.items() if k != "swarm"} == {k: v for k, v in one_a.defaults.items() if k != "swarm"}
    assert spec.defaults["swarm"] == {**one_a.defaults["swarm"], "cross_tokenizer": True}
    assert (spec.experiment.steps, spec.eval) == (one_a.experiment.steps, one_a.eval)
    # every pair runs on every seed of the file: the same seeds, at least 16, none used by 1a (0-23)
    seeds = spec.experiment.seeds
    assert len(seeds) >= 16 and not set(seeds) & set(range(24)) and spec.eval.problems == 1024
    runs = spec.runs()
    for pair in pairs:
        assert sorted({s for p, a, s in runs if p.name == pair and a.name == "f-tis"}) == sorted(seeds)
    assert {s for p, a, s in runs if a.isolated} == set(seeds)
    # each node of a cross pair has its isolated run and its same-tokenizer F-TIS reference on those seeds
    isolated = {n for p, a, _ in runs if a.isolated for n in p.nodes}
    assert isolated == {n.name for n in spec.nodes}
    contrasts = [parse_contrast(c) for c in spec.metrics.contrasts]
    for cross in ("cross-a", "cross-b"):
        for node in pairs[cross].nodes:
            ref = next(p for p in ("same-bytes", "same-bpe") if node in pairs[p].nodes)
            assert ((cross, "f-tis"), (ref, "f-tis")) in contrasts
    assert spec.metrics.primary == "weak_skill"


def test_staleness_sweep_lags_and_seeds(tmp_path):
    """The staleness sweep (issue 42): 1a's pair and settings, F-TIS and NoIS at the same lags, fresh seeds,
    and every lag admitted and kept by the nodes until it arrives."""
    from swarm_node.experiment.configs import node_config

    spec, one_a = _experiment("sandbox_staleness.toml"), _experiment("sandbox_power_long.toml")
    assert spec.pairs[0].nodes == ["add-spec", "sub-spec"]
    for name in ("add-spec", "sub-spec"):
        assert spec.node(name) == one_a.node(name)
    assert spec.defaults == one_a.defaults and spec.eval == one_a.eval and spec.experiment.steps == 100
    lags = {}
    for arm in spec.arms:
        if not arm.isolated:
            lags.setdefault(arm.variant_name, set()).add(spec.peer_lag(arm))
    assert lags == {"f-tis": {0, 1, 2, 4, 8, 16}, "nois": {0, 1, 2, 4, 8, 16}}
    assert len(spec.experiment.seeds) >= 8 and not set(spec.experiment.seeds) & set(range(40))
    for arm in spec.arms:
        cfg = node_config(spec, spec.nodes[0], arm, 40, 0, tmp_path / arm.name, "unused")
        lag = spec.peer_lag(arm)
        assert cfg.swarm.staleness_steps >= lag + 1 or arm.isolated
        assert cfg.swarm.record_ttl_s > (lag + 1) * cfg.swarm.window_seconds


def test_quick_runs_warm_briefly_and_keep_every_arm():
    """`--quick` (which must finish in about 5 minutes) caps the warm-ups, whose steps are part of their
    cache key, so a quick run neither trains 300-step warm-ups nor reuses or overwrites the grid's."""
    from swarm_node.experiment.spec import QUICK_WARMUP_STEPS

    for name in ("sandbox_staleness.toml", "sandbox_crosstok_long.toml"):
        spec = _experiment(name)
        quick = spec.quick()
        assert [a.name for a in quick.arms] == [a.name for a in spec.arms] and len(quick.experiment.seeds) == 1
        for full, short in zip(spec.nodes, quick.nodes, strict=True):
            assert full.warmup["steps"] > QUICK_WARMUP_STEPS == short.warmup["steps"]
            seed = quick.experiment.seeds[0]
            assert full.warmup_for(spec, seed).cache_name() != short.warmup_for(quick, seed).cache_name()
