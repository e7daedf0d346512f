"""Which dtype each part of a node holds and computes in (docs/method.md, "Precision").

Three dtypes, resolved once from the config and the device:

  - the *parameter* dtype of weights the optimizer updates: float32 (master weights; AdamW's
    moments follow them). An Adam update of about the learning rate is below half a bfloat16 ulp
    for most weights, so bf16 weights updated in place barely move (one step at lr 1e-6 changes
    about 2% of weights of std 0.02, 0.4% of SmolLM2-135M's); the config refuses that unless
    `train.allow_low_precision_updates` is set;
  - the *compute* dtype of forward and backward passes (`torch.autocast`): bfloat16 on GPUs that
    support it, float32 on CPUs (`auto`); frozen weights (a LoRA node's base) are stored in it;
  - the *generator's* dtype (vLLM's engine, `generation.dtype`): bfloat16 on CUDA, float32 on CPU
    (`auto`); weight syncs cast to it.

Sampled-token logprobs are always computed in float32 from the (possibly bf16) logits
(`scoring.sampled_logprobs`), so the trainer's and the generator's logprobs are the same quantity.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def bf16_supported(device: torch.device) -> bool:
    """Whether `device` computes in bfloat16 natively (CUDA with compute capability >= 8.0)."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """A compute or generator dtype name -> torch dtype; `auto`: bfloat16 on a CUDA device that
    supports it, float16 on an older CUDA device, float32 on a CPU."""
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if bf16_supported(device) else torch.float16
    return torch.float32


def resolve_compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """The training compute dtype: as `resolve_dtype`, but `auto` never picks float16 (training in
    float16 needs loss scaling, which the trainer does not do): float32 where bf16 is missing."""
    if name == "auto" and device.type == "cuda" and not bf16_supported(device):
        return torch.float32
    return resolve_dtype(name, device)


def resolve_param_dtype(name: str, compute: torch.dtype, frozen_base: bool) -> torch.dtype:
    """The dtype a model's weights are loaded in. `auto`: float32 when the optimizer updates them
    (full fine-tuning), the compute dtype when they are a frozen base (LoRA: peft keeps the adapter
    in float32 whatever the base's dtype)."""
    if name != "auto":
        return DTYPES[name]
    return compute if frozen_base else torch.float32


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """`torch.autocast` to `dtype` on `device`'s type; a no-op context for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@contextlib.contextmanager
def no_autocast(device: torch.device) -> Iterator[None]:
    """Leave any enclosing autocast (for float32 arithmetic inside an autocast region)."""
    with torch.autocast(device_type=device.type, enabled=False):
        yield
