"""The device check on the CPU (`python -m benchmarks.gpu_check --device cpu --quick`), and the import
boundary that lets it run on a GPU machine without the network stack."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from benchmarks.gpu_check import parts, proofs, verdict
from benchmarks.gpu_check.parts import Build

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
@pytest.mark.timeout(1800)  # the check's own limit below; it took 666 s at load 7-12 (the 152k-vocabulary shape)
def test_cpu_device_check_proves_what_it_claims() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800, check=False)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    changed = result["params_changed_fraction"]
    assert changed["bf16_compute"] >= 0.99 and changed["float32"] >= 0.99
    assert changed["bf16_inplace"] < 0.5  # the contrast: in-place bf16 updates mostly round away
    assert result["resume_ok"] is True and result["resume"]["optimizer_state_equal"] is True
    assert result["resume"]["optimizer_state_misplaced"] == []
    assert set(result["sync"]) == {"full", "tied", "lora_merged", "lora_adapter"}
    # hf: the generator is the trained module: nothing is synced, so nothing is proved either way
    assert result["sync_not_applicable"] == sorted(result["sync"])
    assert {s["verdict"] for s in result["sync"].values()} == {"not applicable"}
    agreement = result["logprob_agreement"]
    assert set(agreement) == {"trainer_float32/generator_float32", "trainer_bfloat16/generator_bfloat16"}
    for pair in agreement.values():  # judged at a temperature below 1, against a bound per dtype pair
        assert pair["temperature"] < 1 and pair["mean_abs"] <= pair["bound"]
    assert set(result["memory_estimate_ratio"]) == {"10m", "30m", "gqa7-152k"}  # GQA 7:1, 152k vocabulary
    assert result["shapes"]["gqa7-152k"]["spec"] == "tiny-random:224x2-g7-v151936"
    for ratio in result["memory_estimate_ratio"].values():
        assert 0.75 <= ratio <= 1.33
    assert proc.returncode == 0 and result["ok"] is True, result["failures"]


# ---- each proof against a broken node -----------------------------------------------------------
# The proofs run on tiny models with the hf backend; each test feeds one proof a node broken the way
# a GPU port could break it (through `parts.Build`, the functions a proof builds its pieces with) and
# sees the verdict fail, beside the healthy node passing the same proof.


@pytest.fixture(scope="module")
def gc_args() -> Iterator[argparse.Namespace]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield argparse.Namespace(device="cpu", backend="hf", prompts=2, group_size=4, max_new_tokens=12, micro_batch=8)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gc_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu-check-models")


class CopyGenerator:
    """A generator holding its own copy of the weights, as a vLLM engine does (hf generation on the
    copy); `follows=False`: a sync that never reaches it."""

    def __init__(self, policy: Any, settings: Any, follows: bool = True) -> None:
        from swarm_node.config import GenerationConfig
        from swarm_node.policy.generation import HFGenerator

        own = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
        self.inner = HFGenerator(own, GenerationConfig(backend="hf", temperature=settings.temperature,
                                                       max_new_tokens=12), seed=0)
        self.follows = follows

    def generate(self, prompts: Any, n: int) -> Any:
        return self.inner.generate(prompts, n)

    def sync_weights(self, model: Any) -> None:
        if self.follows:
            with torch.no_grad():
                for mine, theirs in zip(self.inner.model.parameters(), model.parameters(), strict=True):
                    mine.copy_(theirs)

    def close(self) -> None:
        pass


def test_sync_proof_passes_a_generator_that_follows_at_the_examples_rates_and_fails_one_that_does_not(
        gc_args: argparse.Namespace, gc_cache: Path) -> None:
    modes = ("full", "lora_merged")  # full fine-tuning at 1e-6 and LoRA at 1e-5: the smallest changes to see
    follows = proofs.sync_check(gc_args, gc_cache, Build(generator=lambda a, p, s: CopyGenerator(p, s)), modes)
    assert {m: s["lr"] for m, s in follows.items()} == {"full": 1e-6, "lora_merged": 1e-5}
    assert all(verdict.sync_verdict(s) == "pass" for s in follows.values()), follows
    assert verdict.judge_sync(follows) == []
    stuck = proofs.sync_check(gc_args, gc_cache, Build(generator=lambda a, p, s: CopyGenerator(p, s, follows=False)),
                              modes)
    assert all(verdict.sync_verdict(s) == "fail" for s in stuck.values()), stuck
    assert len(verdict.judge_sync(stuck)) == 2 and "does not follow" in verdict.judge_sync(stuck)[0]


def test_sync_proof_on_the_hf_backend_is_not_applicable_rather_than_passed(gc_args: argparse.Namespace,
                                                                            gc_cache: Path) -> None:
    hf = proofs.sync_check(gc_args, gc_cache, modes=("full", "lora_adapter"))
    assert {verdict.sync_verdict(s) for s in hf.values()} == {verdict.NOT_APPLICABLE}
    assert all("not applicable" in s["generator"] for s in hf.values()) and verdict.judge_sync(hf) == []


class UntemperedGenerator:
    """Samples at the configured temperature but reports log softmax(logits), not log softmax(logits / T):
    the raw-versus-processed mix-up (vLLM's default `raw_logprobs` mode would do this)."""

    def __init__(self, args: argparse.Namespace, policy: Any, settings: Any) -> None:
        self.policy, self.inner = policy, parts.make_generator_for(args, policy, settings)

    def generate(self, prompts: Any, n: int) -> Any:
        from swarm_node.policy.scoring import token_logprobs

        groups = self.inner.generate(prompts, n)
        with torch.no_grad():
            for p, group in zip(prompts, groups, strict=True):
                raw = token_logprobs(self.policy.model, [p] * len(group), [c.token_ids for c in group], 1.0, 8)
                for c, lp in zip(group, raw, strict=True):
                    c.logprobs[:] = lp.numpy()
        return groups

    def close(self) -> None:
        self.inner.close()


def test_agreement_proof_is_judged_per_dtype_pair_and_catches_untempered_logprobs(gc_args: argparse.Namespace,
                                                                                 gc_cache: Path) -> None:
    healthy = proofs.agreement_check(gc_args, gc_cache)
    assert set(healthy) == {"trainer_float32/generator_float32", "trainer_bfloat16/generator_bfloat16"}
    assert all(e["temperature"] < 1 for e in healthy.values()) and verdict.judge_agreement(healthy) == []
    assert healthy["trainer_float32/generator_float32"]["mean_abs"] < 1e-4
    broken = proofs.agreement_check(gc_args, gc_cache, Build(generator=UntemperedGenerator))
    failed = verdict.judge_agreement(broken)
    assert len(failed) == 2 and "exceeds" in failed[0], broken


def test_precision_proof_fails_when_the_weights_do_not_move(gc_args: argparse.Namespace, gc_cache: Path) -> None:
    def stuck_trainer(policy: Any, cfg: Any, temperature: float) -> Any:
        trainer = parts.make_trainer(policy, cfg, temperature)
        real_step = trainer.step

        def step(samples: Any) -> Any:  # the update is computed, then the weights are put back
            before = [p.detach().clone() for p in trainer.params]
            metrics = real_step(samples)
            with torch.no_grad():
                for p, b in zip(trainer.params, before, strict=True):
                    p.copy_(b)
            return metrics

        trainer.step = step
        return trainer

    spec = "tiny-random:128x2-v2048"
    healthy = proofs.precision_check(gc_args, spec, gc_cache)
    assert verdict.judge_precision(healthy) == [] and healthy["bf16_inplace"]["params_changed_fraction"] < 0.5
    broken = proofs.precision_check(gc_args, spec, gc_cache, Build(trainer=stuck_trainer))
    assert broken["float32"]["elements_with_gradient"] > 0
    assert len(verdict.judge_precision(broken)) == 2


def test_resume_proof_fails_when_the_optimizer_state_is_lost(gc_args: argparse.Namespace, gc_cache: Path) -> None:
    ok, detail = proofs.resume_check(gc_args, gc_cache)
    assert ok and detail["optimizer_state_equal"] and detail["optimizer_tensors"] > 0, detail
    assert detail["optimizer_state_misplaced"] == [] and verdict.judge_resume(ok, detail) == []

    def weights_only(node_dir: Path, trainer: Any) -> Any:  # a resume that restores weights and step, not AdamW
        loaded = parts.resume(node_dir, trainer)
        trainer.optimizer.state.clear()
        return loaded

    ok, detail = proofs.resume_check(gc_args, gc_cache, Build(resume=weights_only))
    assert not ok and detail["weights_equal"] and not detail["optimizer_state_equal"]
    assert verdict.judge_resume(ok, detail)[0].startswith("resume failed")


def test_memory_verdict_bounds_the_estimate_ratio() -> None:
    assert verdict.judge_memory({"10m": 1.0, "gqa7-152k": 0.8}) == []
    failed = verdict.judge_memory({"10m": 1.0, "gqa7-152k": 0.5})
    assert len(failed) == 1 and "gqa7-152k" in failed[0] and "0.50" in failed[0]
