"""Sampled-token logprobs of completions under a model: the trainer's side of every ratio.

`token_logprobs` scores (prompt, completion) pairs as log_softmax(logits / temperature) at each
completion token, the same quantity the generators report, so on-policy ratios are exactly 1 up
to floating point. Sequences are right-padded (positions are then plain 0..L-1 for every row, as in
an unpadded forward pass) and scored in micro-batches to bound memory; the language-model head
runs only from the shortest prompt's last token on (`logits_to_keep`), so long shared prompts
cost no vocabulary-sized activations.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

IntSeq = Sequence[int] | Tensor


def pad_right(rows: Sequence[Tensor], value: float, dtype: torch.dtype | None = None) -> Tensor:
    """Stack 1-D tensors of varying length into [B, max_len], filling the tail with `value`."""
    width = max((len(r) for r in rows), default=0)
    dtype = dtype if dtype is not None else (rows[0].dtype if rows else torch.float32)
    device = rows[0].device if rows else None
    out = torch.full((len(rows), width), value, dtype=dtype, device=device)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def padded_batch(rows: Sequence[Tensor], value: float = 0.0) -> tuple[Tensor, Tensor]:
    """[B, T] right-padded values and the [B, T] bool mask of valid positions (for the objective)."""
    values = pad_right(rows, value)
    lengths = torch.tensor([len(r) for r in rows], device=values.device)  # [B]
    mask = torch.arange(values.shape[1], device=values.device)[None, :] < lengths[:, None]  # [B, T]
    return values, mask


def _as_long(ids: IntSeq, device: torch.device) -> Tensor:
    if isinstance(ids, Tensor):
        return ids.to(device=device, dtype=torch.long).reshape(-1)
    return torch.as_tensor(list(ids), dtype=torch.long, device=device).reshape(-1)


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _score_micro_batch(model: torch.nn.Module, prompts: list[Tensor], completions: list[Tensor],
                       temperature: float) -> list[Tensor]:
    """Logprobs for one micro-batch; returns one [T_i] float32 tensor per row."""
    device = prompts[0].device
    p_lens = [len(p) for p in prompts]
    c_lens = [len(c) for c in completions]
    if min(p_lens) < 1:
        raise ValueError("every prompt needs at least one token (the first completion token is predicted from it)")
    rows = [torch.cat([p, c]) for p, c in zip(prompts, completions, strict=True)]
    input_ids = pad_right(rows, 0, torch.long)  # [B, L]
    lengths = torch.tensor([len(r) for r in rows], device=device)
    attention_mask = (torch.arange(input_ids.shape[1], device=device)[None, :] < lengths[:, None]).long()
    first = min(p_lens) - 1  # earliest column whose logits predict a completion token
    keep = input_ids.shape[1] - first
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep,
                   use_cache=False).logits  # [B, keep, V]
    t_max = max(c_lens)
    offs = torch.arange(t_max, device=device)[None, :]  # [1, T]
    starts = torch.tensor(p_lens, device=device)[:, None] - 1 - first  # [B, 1]
    cols = (starts + offs).clamp(max=keep - 1)  # [B, T] kept column predicting completion token t
    picked = torch.take_along_dim(logits, cols[:, :, None], dim=1).float() / temperature  # [B, T, V]
    targets = pad_right(completions, 0, torch.long)  # [B, T]
    token_logit = torch.take_along_dim(picked, targets[:, :, None], dim=2).squeeze(2)  # [B, T]
    logprobs = token_logit - torch.logsumexp(picked, dim=2)  # [B, T]
    return [logprobs[i, :n] for i, n in enumerate(c_lens)]


def token_logprobs(model: torch.nn.Module, prompt_ids: Sequence[IntSeq], completion_ids: Sequence[IntSeq],
                   temperature: float, micro_batch_size: int) -> list[Tensor]:
    """log softmax(logits / temperature) of each completion token given its prompt and prefix.

    Returns one float32 [T_i] tensor per pair, on the model's device, connected to the graph when
    gradients are enabled (wrap in `torch.no_grad()` otherwise). Empty completions give empty
    tensors. Rows are processed `micro_batch_size` at a time, in the given order.
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    device = _model_device(model)
    prompts = [_as_long(p, device) for p in prompt_ids]
    completions = [_as_long(c, device) for c in completion_ids]
    out: list[Tensor] = [torch.zeros(0, device=device)] * len(prompts)
    live = [i for i, c in enumerate(completions) if len(c) > 0]
    for start in range(0, len(live), micro_batch_size):
        idx = live[start : start + micro_batch_size]
        scored = _score_micro_batch(model, [prompts[i] for i in idx], [completions[i] for i in idx], temperature)
        for i, lp in zip(idx, scored, strict=True):
            out[i] = lp
    return out
