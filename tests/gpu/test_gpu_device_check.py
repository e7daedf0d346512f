"""The device check's proofs on a CUDA device (marker `gpu`: never run in CI; run it where CUDA exists
with `python -m pytest -m gpu tests/gpu`). The same proofs run on the CPU in the slow suite
(tests/unit/test_gpu_check.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_check_proves_training_sync_resume_and_memory() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--device", "cuda"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["params_changed_fraction"]["bf16_compute"] >= 0.99
    assert result["params_changed_fraction"]["bf16_inplace"] < 0.5
    assert result["resume_ok"] is True and result["resume"]["optimizer_state_misplaced"] == []
    for mode, sync in result["sync"].items():  # hf on the GPU: the generator is the trained module
        assert sync["verdict"] == "not applicable", mode
    for pair, entry in result["logprob_agreement"].items():
        assert entry["mean_abs"] <= entry["bound"], pair
    assert "gqa7-152k" in result["memory_estimate_ratio"]
    for name, ratio in result["memory_estimate_ratio"].items():
        assert 0.75 <= ratio <= 1.33, name
    assert proc.returncode == 0 and result["ok"], result["failures"]
