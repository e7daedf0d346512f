"""Sampled-token logprobs of completions under a model: the trainer's side of every ratio.

`token_logprobs` scores (prompt, completion) pairs as log_softmax(logits / temperature) at each
completion token, the same quantity the generators report, so on-policy ratios are exactly 1 up
to floating point. Sequences are right-padded (positions are then plain 0..L-1 for every row, as in
an unpadded forward pass) and scored in micro-batches to bound memory; the language-model head
runs only from the shortest prompt's last token on (`logits_to_keep`), so long shared prompts
cost no vocabulary-sized activations. A micro-batch whose rows all share one prompt (a group)
runs the prompt once and the completions on top of its key/value cache, expanded to the batch
(`_score_shared_prompt`); gradients flow through the shared prompt pass as through separate ones.
A micro-batch of several prompts' groups (`train.pack_prompts`) runs each distinct prompt once,
left-padded, and each row's completion on its prompt's cache (`_score_prompt_groups`).
Logprobs are float32 whatever the model's compute dtype, computed from the logits a chunk of rows at a
time (`sampled_logprobs`): no float32 copy of the full-vocabulary logits is made, forward or backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from swarm_node.policy.precision import autocast

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


LOGPROB_CHUNK_ROWS = 1024  # logit rows ([V] each) turned into float32 at a time


class _SampledLogprobs(torch.autograd.Function):
    """log softmax(logits / T)[target] per row, in float32, from logits of any dtype, `chunk` rows at a
    time: no float32 copy of the whole [N, V] logits exists, forward or backward. The backward pass
    recomputes each chunk's softmax from the saved logits and the saved float32 log-normaliser:
    d out_n / d logits_n = (onehot(target_n) - softmax(logits_n / T)) / T."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, temperature: float, chunk: int) -> Tensor:
        n = logits.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=logits.device)  # [N]
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)  # [N]
        for a in range(0, n, chunk):
            scaled = logits[a : a + chunk].float() / temperature  # [c, V]
            lse[a : a + chunk] = torch.logsumexp(scaled, dim=1)
            out[a : a + chunk] = scaled.gather(1, targets[a : a + chunk, None]).squeeze(1) - lse[a : a + chunk]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        grad = torch.empty_like(logits)  # [N, V] in the logits' dtype
        for a in range(0, logits.shape[0], chunk):
            g = grad_out[a : a + chunk, None].float()  # [c, 1]
            probs = torch.exp(logits[a : a + chunk].float() / t - lse[a : a + chunk, None])  # [c, V]
            part = probs.mul_(-g)
            part.scatter_add_(1, targets[a : a + chunk, None], g)
            grad[a : a + chunk] = part.div_(t)
        return grad, None, None, None


def sampled_logprobs(logits: Tensor, targets: Tensor, temperature: float, chunk: int = LOGPROB_CHUNK_ROWS) -> Tensor:
    """[B, T] float32 log softmax(logits / temperature) at `targets` ([B, T]); logits [B, T, V] in any
    dtype (bf16 logits are read in float32 chunk by chunk, never copied whole). Differentiable."""
    b, t, v = logits.shape
    if b * t == 0:
        return torch.zeros(b, t, dtype=torch.float32, device=logits.device)
    flat = _SampledLogprobs.apply(logits.reshape(b * t, v), targets.reshape(b * t), float(temperature), chunk)
    return flat.reshape(b, t)


def _score_shared_prompt(model: torch.nn.Module, prompt: Tensor, completions: list[Tensor],
                         temperature: float) -> list[Tensor] | None:
    """Rows that share `prompt`: one prompt pass, its cache repeated for the completions.

    Returns None when the model's cache cannot be expanded (the caller scores rows separately).
    """
    b, p_len = len(completions), len(prompt)
    out = model(input_ids=prompt[None], use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        return None
    first_logits = out.logits[:, -1:].expand(b, 1, -1)  # [b, 1, V] predicts completion token 0
    prefix_mask = torch.ones(b, p_len, dtype=torch.long, device=prompt.device)  # [b, P]
    return _completions_on_cache(model, first_logits, cache, None, prefix_mask,
                                 torch.full((b,), p_len, device=prompt.device), completions, temperature)


def _completions_on_cache(model: torch.nn.Module, first_logits: Tensor, cache: Any, rows: Tensor | None,
                          prefix_mask: Tensor, starts: Tensor, completions: list[Tensor],
                          temperature: float) -> list[Tensor]:
    """Logprobs of each row's completion on top of its prompt's cache, expanded to one cache row per
    completion (`rows`: the cache row of each; None: one prompt, repeated): `first_logits` [b, 1, V]
    predict token 0, tokens 0..T-2 run on the cache (`prefix_mask` [b, P] its valid columns,
    `starts` [b] each row's first completion position)."""
    device = first_logits.device
    targets = pad_right(completions, 0, torch.long)  # [b, T]
    t_max = targets.shape[1]
    lengths = torch.tensor([len(c) for c in completions], device=device)
    if t_max > 1:  # completion tokens 0..T-2 predict tokens 1..T-1 on top of the prompt's cache
        if rows is None:
            cache.batch_repeat_interleave(len(completions))
        else:
            cache.batch_select_indices(rows)
        valid = torch.arange(t_max - 1, device=device)[None, :] < lengths[:, None]  # [b, T-1]
        attention_mask = torch.cat([prefix_mask, valid.long()], dim=1)  # [b, P + T-1]
        positions = starts[:, None] + torch.arange(t_max - 1, device=device)[None, :]  # [b, T-1]
        rest = model(input_ids=targets[:, :-1], attention_mask=attention_mask, past_key_values=cache,
                     position_ids=positions, use_cache=True).logits  # [b, T-1, V]
        logprobs = torch.cat([sampled_logprobs(first_logits, targets[:, :1], temperature),
                              sampled_logprobs(rest, targets[:, 1:], temperature)], dim=1)  # [b, T]
    else:
        logprobs = sampled_logprobs(first_logits, targets, temperature)  # [b, 1]
    return [logprobs[i, :n] for i, n in enumerate(lengths.tolist())]


def _score_prompt_groups(model: torch.nn.Module, prompts: list[Tensor], row_prompt: list[int],
                         completions: list[Tensor], temperature: float) -> list[Tensor] | None:
    """Rows of several prompts (row i has `prompts[row_prompt[i]]`): one pass over the distinct
    prompts, left-padded so that each ends in the last column, then each row's completion on top of
    its prompt's cache (selected per row); pad columns are masked and positions count real tokens.

    Returns None when the model's cache cannot select rows (the caller scores rows separately).
    """
    device = prompts[0].device
    p_lens = torch.tensor([len(p) for p in prompts], device=device)  # [U]
    width = int(p_lens.max())
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
    for u, p in enumerate(prompts):
        ids[u, width - len(p):] = p
    prompt_mask = (torch.arange(width, device=device)[None, :] >= (width - p_lens)[:, None]).long()  # [U, P]
    out = model(input_ids=ids, attention_mask=prompt_mask, position_ids=(prompt_mask.cumsum(1) - 1).clamp(min=0),
                use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    if cache is None or not hasattr(cache, "batch_select_indices"):
        return None
    rows = torch.tensor(row_prompt, device=device)  # [b]
    return _completions_on_cache(model, out.logits[rows, -1:], cache, rows, prompt_mask[rows], p_lens[rows],
                                 completions, temperature)


def distinct_rows(rows: Sequence[Tensor]) -> tuple[list[int], list[int]]:
    """(the index of each distinct row's first appearance, each row's index among the distinct ones)."""
    keys: dict[tuple[int, ...], int] = {}
    which = [keys.setdefault(tuple(r.tolist()), len(keys)) for r in rows]
    return [which.index(u) for u in range(len(keys))], which


def _score_micro_batch(model: torch.nn.Module, prompts: list[Tensor], completions: list[Tensor],
                       temperature: float, share_prompts: bool) -> list[Tensor]:
    """Logprobs for one micro-batch; returns one [T_i] float32 tensor per row."""
    if min(len(p) for p in prompts) < 1:
        raise ValueError("every prompt needs at least one token (the first completion token is predicted from it)")
    if len(prompts) > 1 and share_prompts:
        firsts, row_prompt = distinct_rows(prompts)
        if len(firsts) == 1:  # one prompt: run it once, its cache repeated
            scored = _score_shared_prompt(model, prompts[0], completions, temperature)
        elif len(firsts) < len(prompts):  # some rows share a prompt: run each distinct prompt once
            scored = _score_prompt_groups(model, [prompts[i] for i in firsts], row_prompt, completions, temperature)
        else:
            scored = None
        if scored is not None:
            return scored
    device = prompts[0].device
    p_lens = [len(p) for p in prompts]
    c_lens = [len(c) for c in completions]
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
    if len(set(p_lens)) == 1:  # every row's completion starts in the same kept column
        picked = logits[:, starts[0, 0] : starts[0, 0] + t_max]  # [B, T, V], a view
    else:
        picked = torch.take_along_dim(logits, cols[:, :, None], dim=1)  # [B, T, V]
    logprobs = sampled_logprobs(picked, pad_right(completions, 0, torch.long), temperature)  # [B, T]
    return [logprobs[i, :n] for i, n in enumerate(c_lens)]


def token_logprobs(model: torch.nn.Module, prompt_ids: Sequence[IntSeq], completion_ids: Sequence[IntSeq],
                   temperature: float, micro_batch_size: int, *, compute_dtype: torch.dtype = torch.float32,
                   share_prompts: bool = True) -> list[Tensor]:
    """log softmax(logits / temperature) of each completion token given its prompt and prefix.

    Returns one float32 [T_i] tensor per pair, on the model's device, connected to the graph when
    gradients are enabled (wrap in `torch.no_grad()` otherwise). Empty completions give empty
    tensors. Rows are processed `micro_batch_size` at a time, in the given order. The model runs
    under autocast to `compute_dtype` (`precision.autocast`; float32: none); the logprobs are float32
    either way. `share_prompts=False` scores every row as a whole sequence, without a prompt cache
    (needed under gradient checkpointing, which drops caches in the checkpointed layers).
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
        with autocast(device, compute_dtype):
            scored = _score_micro_batch(model, [prompts[i] for i in idx], [completions[i] for i in idx], temperature,
                                        share_prompts)
        for i, lp in zip(idx, scored, strict=True):
            out[i] = lp
    return out
