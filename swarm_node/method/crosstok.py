"""Aligning two tokenizations of the same text, for F-TIS across tokenizers (pure: no I/O, no model).

A peer whose tokenizer differs sends, per completion, the text and the byte length of each of its
tokens' pieces of `text.encode("utf-8")` (`piece_bytes`). This node tokenizes the same text with
its own tokenizer. Two token streams over the same bytes share some byte boundaries (0 and the end
at least); a *chunk* is a maximal span between consecutive common boundaries, so each chunk is a
whole number of tokens on both sides, and no shorter span is. Per chunk:

    log pi_gen(chunk)   = sum of the sender's token logprobs in it
    log pi_theta(chunk) = sum of this node's token logprobs in it

and the chunk takes the place of the token in F-TIS: its truncated weight min(pi_theta/pi_gen, C)
applies to each own token in it, and the per-sample KL of the filter is the same estimator
(`swarm_node.method.kl`) over chunk log-ratios (`swarm_node.method.chunks`). With identical tokenizers
every chunk is one token on each side, and everything reduces to the per-token form exactly.

Zero-byte tokens (a special token such as EOS, or a token whose bytes are realised by the next
one) carry no text, so bytes cannot place them. The rule, the same on both sides:
  * trailing zero-byte tokens (after the last byte) form one final end-of-sequence chunk when both
    sides have at least one (the sender's EOS paired with this node's EOS: both finished "stop");
    when only one side has them, they join the last chunk with bytes;
  * every other zero-byte token joins the chunk of the next token with bytes (a leading marker, or
    a token holding the first bytes of a character that the next token completes, belongs with
    the text that follows it).
Two sides whose only tokens are zero-byte ones align only through the end-of-sequence chunk; any
other token stream without bytes cannot be aligned (`AlignmentError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class AlignmentError(ValueError):
    """Two token streams that cannot be aligned (different byte totals, or nothing to align)."""


@dataclass(frozen=True)
class Alignment:
    """Chunks of two tokenizations of one byte string.

    chunks_a: int64 [T_a], chunks_b: int64 [T_b]: the chunk index of each token of either side,
              nondecreasing from 0, every index in [0, n_chunks) used on both sides.
    n_chunks: number of chunks (end-of-sequence chunk included when there is one).
    eos_chunk: whether the last chunk is the end-of-sequence chunk of the two sides' trailing
              zero-byte tokens.
    """

    chunks_a: np.ndarray
    chunks_b: np.ndarray
    n_chunks: int
    eos_chunk: bool


def _as_lengths(piece_bytes: Sequence[int] | np.ndarray, side: str) -> np.ndarray:
    lengths = np.asarray(piece_bytes, dtype=np.int64).reshape(-1)
    if (lengths < 0).any():
        raise AlignmentError(f"side {side}: negative piece byte length")
    return lengths


def _trailing_zeros(lengths: np.ndarray) -> int:
    """How many zero-byte tokens end the stream (after its last byte)."""
    nonzero = np.flatnonzero(lengths)
    return len(lengths) - (int(nonzero[-1]) + 1 if len(nonzero) else 0)


def _side_chunks(lengths: np.ndarray, common: np.ndarray, n_content: int, eos: bool) -> np.ndarray:
    """Chunk index of each token of one side given the common boundaries (sorted, 0 and total)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else np.zeros(0, np.int64)
    # A token with bytes starts at or after a common boundary and ends at or before the next one.
    chunks = np.searchsorted(common, starts, side="right") - 1  # [T]
    has_bytes = lengths > 0
    trailing = _trailing_zeros(lengths)
    body = len(lengths) - trailing
    # Non-trailing zero-byte tokens join the next token with bytes: take its chunk (a reverse fill).
    idx = np.where(has_bytes[:body], np.arange(body), body)  # body = "no token with bytes yet"
    next_with_bytes = np.minimum.accumulate(idx[::-1])[::-1] if body else idx
    out = np.empty(len(lengths), dtype=np.int64)
    out[:body] = chunks[next_with_bytes] if body else chunks[:0]
    out[body:] = n_content if eos else n_content - 1
    return out


def align(piece_bytes_a: Sequence[int] | np.ndarray, piece_bytes_b: Sequence[int] | np.ndarray) -> Alignment:
    """Chunks of two tokenizations of one byte string, from each token's byte length (module doc).

    Raises `AlignmentError` when the byte totals differ, or when a side with tokens has no chunk
    to put them in (no bytes at all and no end-of-sequence chunk)."""
    a, b = _as_lengths(piece_bytes_a, "a"), _as_lengths(piece_bytes_b, "b")
    total = int(a.sum())
    if int(b.sum()) != total:
        raise AlignmentError(f"the two sides cover {total} and {int(b.sum())} bytes")
    eos = _trailing_zeros(a) > 0 and _trailing_zeros(b) > 0
    if total > 0:
        common = np.intersect1d(np.cumsum(np.concatenate([[0], a])), np.cumsum(np.concatenate([[0], b])))
        n_content = len(common) - 1
    else:
        common, n_content = np.zeros(1, dtype=np.int64), 0
        if not eos and (len(a) or len(b)):
            raise AlignmentError("no bytes and no end-of-sequence chunk on both sides: nothing to align")
    return Alignment(chunks_a=_side_chunks(a, common, n_content, eos), chunks_b=_side_chunks(b, common, n_content, eos),
                     n_chunks=n_content + int(eos), eos_chunk=eos)


def chunk_logprobs(logprobs: Sequence[float] | np.ndarray, chunks: np.ndarray, n_chunks: int) -> np.ndarray:
    """float64 [n_chunks]: the sum of the token logprobs of each chunk (log of the chunk's probability)."""
    values = np.asarray(logprobs, dtype=np.float64).reshape(-1)
    if values.shape != chunks.shape:
        raise ValueError(f"{len(values)} logprobs for {len(chunks)} tokens")
    return np.bincount(chunks, weights=values, minlength=n_chunks)


def last_token_shares(chunk_values: np.ndarray, chunks: np.ndarray) -> np.ndarray:
    """float64 [T]: each chunk's value on its last token, 0 on its other tokens, so that summing the
    result over a chunk's tokens gives the chunk's value back (the per-token layout the objective
    reads, `TrainSample.generator_logprobs`). With one token per chunk, the values themselves."""
    out = np.zeros(len(chunks), dtype=np.float64)
    if len(chunks):
        last = np.flatnonzero(np.append(chunks[1:] != chunks[:-1], True))  # last token of each chunk
        out[last] = chunk_values[chunks[last]]
    return out
