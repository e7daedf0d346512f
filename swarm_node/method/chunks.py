"""Chunk-level log-ratios for samples generated with another tokenizer (`swarm_node.method.crosstok`).

A cross-tokenizer sample's tokens are this node's own; the generator's logprobs exist only per
chunk (a span that is a whole number of tokens on both sides). `ObjectiveInputs.chunk_ids` [B,T]
gives each own token's chunk, and `generator_logprobs` holds per-token shares whose sum over a
chunk is log pi_gen(chunk) (`crosstok.last_token_shares`). Then, per chunk c of sample b,

    log pi(c) = sum over the valid tokens t of c of log pi(t)        (`chunk_sum`, [B,C], C = T)

for pi_theta, pi_theta_old and pi_gen alike, and every ratio against pi_gen is taken per chunk
and broadcast back to the chunk's tokens (`broadcast`). A chunk is valid when it holds a valid
token (`chunk_mask`). Pure tensor functions; with chunk_ids[b, t] = t (one token per chunk) every
one of them returns its input's values exactly: sums of one term, gathers of the same position.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_chunk_ids(chunk_ids: Tensor, mask: Tensor) -> None:
    """Raise ValueError unless chunk_ids is an integer tensor shaped like `mask` [B,T]. Its values
    at valid positions must lie in [0, T) (not checked here: that would synchronise with the
    device; `swarm_node.method.crosstok` makes them so); padded positions are replaced by 0 before use."""
    if chunk_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"chunk_ids must be an integer tensor, got {chunk_ids.dtype}")
    if chunk_ids.shape != mask.shape:
        raise ValueError(f"chunk_ids has shape {tuple(chunk_ids.shape)}, expected {tuple(mask.shape)}")


def _index(chunk_ids: Tensor, mask: Tensor) -> Tensor:
    """[B,T] int64 chunk index, 0 at padded positions (so gathers never leave the row)."""
    return torch.where(mask, chunk_ids.long(), 0)


def chunk_sum(values: Tensor, chunk_ids: Tensor, mask: Tensor) -> Tensor:
    """[B,C] (C = T) the sum of `values` [B,T] over each chunk's valid tokens; 0 for empty chunks.

    Padded values are replaced by 0 first (`torch.where`), so padding garbage never leaks. Carries
    the gradient of `values`."""
    clean = torch.where(mask, values, 0.0)
    return torch.zeros_like(clean).scatter_add(1, _index(chunk_ids, mask), clean)


def chunk_mask(chunk_ids: Tensor, mask: Tensor) -> Tensor:
    """[B,C] bool: chunks holding at least one valid token."""
    hit = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
    return hit.scatter_add(1, _index(chunk_ids, mask), mask.long()) > 0


def broadcast(chunk_values: Tensor, chunk_ids: Tensor, mask: Tensor) -> Tensor:
    """[B,T]: each valid token gets its chunk's value; padded positions get chunk 0's value (the
    caller masks them, as for any padded value)."""
    return torch.take_along_dim(chunk_values, _index(chunk_ids, mask), dim=1)


def tokens_per_chunk(chunk_ids: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """[B,T] in `dtype`: the number of valid tokens in each valid token's chunk (1 at padded positions)."""
    counts = chunk_sum(mask.to(dtype), chunk_ids, mask)  # [B,C]
    return torch.where(mask, broadcast(counts, chunk_ids, mask), 1.0)

