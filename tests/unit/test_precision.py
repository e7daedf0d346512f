"""Mixed precision that trains: float32 master weights under bf16 compute, the refused in-place bf16
configuration, chunked sampled-token logprobs, and gradient checkpointing (docs/method.md, "Precision")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.gpu_check.proofs import changed_elements, watch_step
from swarm_node.config import ModelConfig, NodeConfig, ObjectiveConfig, TrainConfig
from swarm_node.policy.models import load_policy
from swarm_node.policy.precision import resolve_compute_dtype, resolve_dtype, resolve_param_dtype
from swarm_node.policy.scoring import sampled_logprobs, token_logprobs
from swarm_node.policy.trainer import Trainer
from swarm_node.policy.types import TrainSample


def _samples(policy, n_prompts: int = 2, group: int = 4, length: int = 12, seed: int = 0) -> list[TrainSample]:
    """Groups of random completions with mixed rewards (every sample carries gradient)."""
    rng = np.random.default_rng(seed)
    vocab = len(policy.tokenizer)
    out = []
    for p in range(n_prompts):
        prompt = rng.integers(5, vocab, size=7 + p)
        for i in range(group):
            out.append(TrainSample(group_key=f"g{p}", prompt_ids=prompt.astype(np.int64),
                                   completion_ids=rng.integers(5, vocab, size=length - i).astype(np.int64),
                                   generator_logprobs=np.full(length - i, -3.0, dtype=np.float32),
                                   reward=float(i % 2), is_peer=False))
    return out


def _one_step(policy, lr: float) -> float:
    """One trainer step at `lr`; the changed fraction of the trained elements with a non-zero gradient."""
    trainer = Trainer(policy, TrainConfig(learning_rate=lr, micro_batch_size=4), ObjectiveConfig(), temperature=1.0)
    seen = watch_step(trainer)
    assert trainer.step(_samples(policy))["optimizer_steps"] == 1.0
    changed, total = changed_elements(policy, seen)
    assert total > 1000, "the step produced (almost) no gradient: the check would say nothing"
    return changed / total


def test_bf16_compute_over_float32_master_weights_moves_them(tmp_path: Path) -> None:
    policy = load_policy(ModelConfig(name="tiny-random:64x2", device="cpu", compute_dtype="bfloat16",
                                     cache_dir=tmp_path))
    assert policy.compute_dtype == torch.bfloat16
    assert {p.dtype for _, p in policy.trainable_parameters()} == {torch.float32}
    assert _one_step(policy, 1e-6) >= 0.99


def test_in_place_bf16_weights_barely_move(tmp_path: Path) -> None:
    """The configuration the config refuses, allowed explicitly: the contrast the refusal is for."""
    policy = load_policy(ModelConfig(name="tiny-random:64x2", device="cpu", compute_dtype="bfloat16",
                                     param_dtype="bfloat16", cache_dir=tmp_path))
    assert {p.dtype for _, p in policy.trainable_parameters()} == {torch.bfloat16}
    assert _one_step(policy, 1e-6) < 0.5


def test_in_place_low_precision_updates_are_refused_with_one_line() -> None:
    with pytest.raises(ValueError) as e:
        NodeConfig.model_validate({"model": {"param_dtype": "bfloat16"}})
    message = str(e.value)
    assert "train.allow_low_precision_updates" in message and "model.param_dtype='auto'" in message
    allowed = NodeConfig.model_validate({"model": {"param_dtype": "bfloat16"},
                                         "train": {"allow_low_precision_updates": True}})
    assert allowed.model.param_dtype == "bfloat16"
    lora = NodeConfig.model_validate({"model": {"param_dtype": "bfloat16", "lora": {"enabled": True}}})
    assert lora.model.lora.enabled  # a frozen bf16 base is fine: the adapter stays float32
    with pytest.raises(ValueError, match="loss scaling"):
        NodeConfig.model_validate({"model": {"compute_dtype": "float16"}})


def test_dtype_resolution() -> None:
    cpu = torch.device("cpu")
    assert resolve_compute_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("auto", cpu) == torch.float32 and resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_param_dtype("auto", torch.bfloat16, frozen_base=False) == torch.float32
    assert resolve_param_dtype("auto", torch.bfloat16, frozen_base=True) == torch.bfloat16
    legacy = ModelConfig.model_validate({"dtype": "bfloat16"})
    assert legacy.compute_dtype == "bfloat16" and legacy.param_dtype == "auto"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_sampled_logprobs_equal_the_full_computation(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 37, 501, generator=g) * 4).to(dtype).requires_grad_(True)
    targets = torch.randint(0, 501, (3, 37), generator=g)
    weights = torch.randn(3, 37, generator=g)
    reference_logits = logits.detach().clone().requires_grad_(True)
    scaled = reference_logits.float() / 0.7
    reference = torch.take_along_dim(scaled, targets[:, :, None], dim=2).squeeze(2) - torch.logsumexp(scaled, dim=2)
    out = sampled_logprobs(logits, targets, 0.7, chunk=16)  # several chunks, the last one partial
    assert out.dtype == torch.float32
    assert torch.allclose(out, reference, atol=1e-5, rtol=0)
    (out * weights).sum().backward()
    (reference * weights).sum().backward()
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert logits.grad.dtype == dtype
    assert torch.allclose(logits.grad.float(), reference_logits.grad.float(), atol=tol, rtol=0)


def test_gradient_checkpointing_gives_the_same_step(tmp_path: Path) -> None:
    cfg = ModelConfig(name="tiny-random:64x2", device="cpu", cache_dir=tmp_path)
    grads = []
    for checkpoint in (False, True):
        policy = load_policy(cfg)
        trainer = Trainer(policy, TrainConfig(micro_batch_size=4, gradient_checkpointing=checkpoint),
                          ObjectiveConfig(), temperature=1.0)
        assert bool(trainer.checkpoint_layers) == checkpoint
        samples = _samples(policy)
        batch = trainer._prepare(samples)
        trainer._accumulate(batch, [torch.zeros(0)] * len(samples), first_epoch=True)
        grads.append({n: p.grad.clone() for n, p in policy.trainable_parameters()})
        assert not any(m.training for m in policy.model.modules())  # eval mode restored after the pass
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


def test_scoring_under_bf16_autocast_matches_float32_closely(tmp_path: Path) -> None:
    policy = load_policy(ModelConfig(name="tiny-random:64x2", device="cpu", cache_dir=tmp_path))
    samples = _samples(policy)
    prompts, completions = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
    with torch.no_grad():
        full = token_logprobs(policy.model, prompts, completions, 1.0, 4)
        bf16 = token_logprobs(policy.model, prompts, completions, 1.0, 4, compute_dtype=torch.bfloat16)
    gap = max(float((a - b).abs().max()) for a, b in zip(full, bf16, strict=True))
    assert all(b.dtype == torch.float32 for b in bf16)
    assert 0 < gap < 0.1  # bf16 rounding shows, and stays small
