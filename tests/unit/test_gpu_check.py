"""The device check on the CPU (`python -m benchmarks.gpu_check --device cpu --quick`), and the import
boundary that lets it run on a GPU machine without the network stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_training_path_imports_no_network_code() -> None:
    """The device check's imports (config, models, trainer, generation, checkpoints, memory plan)
    load no hivemind, vLLM, Prometheus client or swarm networking: a GPU machine without them runs it (the
    wire format's small pure dependencies, msgpack and zstandard, are carried there like pydantic)."""
    code = ("import sys, benchmarks.gpu_check as g, swarm_node.config, swarm_node.policy.models, "
            "swarm_node.policy.trainer, swarm_node.policy.generation, swarm_node.policy.checkpoint, "
            "swarm_node.policy.memory, swarm_node.tasks, swarm_node.tasks.arithmetic; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('hivemind', 'vllm', "
            "'prometheus_client') or m.startswith(('swarm_node.swarm', 'swarm_node.peers.ledger'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.slow
def test_cpu_device_check_proves_what_it_claims() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, check=False)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    changed = result["params_changed_fraction"]
    assert changed["bf16_compute"] >= 0.99 and changed["float32"] >= 0.99
    assert changed["bf16_inplace"] < 0.5  # the contrast: in-place bf16 updates mostly round away
    assert result["resume_ok"] is True and result["resume"]["optimizer_state_equal"] is True
    assert set(result["sync"]) == {"full", "tied", "lora_merged", "lora_adapter"}
    for sync in result["sync"].values():  # hf: the generator is the trained module, so the gap is ~0
        assert sync["backend"] == "hf" and sync["sync_gap_new"] < 0.1 * sync["sync_gap_old"]
    assert set(result["memory_estimate_ratio"]) == {"10m", "30m"}
    for ratio in result["memory_estimate_ratio"].values():
        assert 0.75 <= ratio <= 1.33
    assert proc.returncode == 0 and result["ok"] is True, result["failures"]
