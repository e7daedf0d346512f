"""Warm-ups: a cached supervised start from a tiny model or from a model the node loads (SmolLM2)."""

from __future__ import annotations

import json

import pytest

from swarm_node.config import ModelConfig
from swarm_node.experiment.warmup import WarmupSpec, ensure_warm_model, warmup_problems
from swarm_node.policy.models import load_policy


@pytest.mark.slow  # trains and saves a 135M model: ~20-60 s
def test_warmup_of_the_embedded_model_is_a_loadable_cached_model(tmp_path):
    spec = WarmupSpec(base="smollm2-135m", steps=2, batch_size=2, learning_rate=1e-5)
    path = ensure_warm_model(spec, tmp_path, log=lambda m: None)
    info = json.loads((path / "warmup.json").read_text())
    assert path.name == spec.cache_name() and info["spec"]["base"] == "smollm2-135m"
    policy = load_policy(ModelConfig(name=str(path), device="cpu", lora={"enabled": True}))
    assert policy.is_lora and policy.tokenizer.eos_token_id is not None
    mtime = (path / "warmup.json").stat().st_mtime_ns
    assert ensure_warm_model(spec, tmp_path, log=lambda m: None) == path  # reused, not retrained
    assert (path / "warmup.json").stat().st_mtime_ns == mtime


def test_specialist_warmup_sees_only_its_operation():
    problems = warmup_problems(WarmupSpec(base="tiny-random:32x1", ops=("add",)), 50)
    assert len(problems) == 50
    for p in problems:
        nums = [int(t) for t in p.question.replace("?", " ").replace(".", " ").split() if t.isdigit()]
        assert nums[0] + nums[1] == int(p.answer)
