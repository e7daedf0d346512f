"""Chunk alignment of two tokenizations (swarm_node.method.crosstok) against a plain-Python reference, on
random text tokenized by real, different tokenizers; the zero-byte (EOS) rule; chunk logprobs."""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import numpy as np
import pytest

from swarm_node.method.crosstok import AlignmentError, align, chunk_logprobs, last_token_shares
from swarm_node.peers.crosstok_receive import own_piece_bytes
from swarm_node.policy import tiny


def reference_align(a: list[int], b: list[int]) -> tuple[list[int], list[int], int]:
    """Two pointers over the byte streams: grow the side that is behind until both reach the same
    offset, then close the chunk. Zero-byte tokens: trailing ones pair into an end chunk when both
    sides have them (else join the last chunk); the others join the next token with bytes."""
    def trailing(x: list[int]) -> int:
        n = 0
        while n < len(x) and x[len(x) - 1 - n] == 0:
            n += 1
        return n

    ta, tb = trailing(a), trailing(b)
    body_a, body_b = a[: len(a) - ta], b[: len(b) - tb]
    ca: list[int] = []
    cb: list[int] = []
    i = j = pos_a = pos_b = chunk = 0
    pending_a = pending_b = 0  # zero-byte tokens waiting for the next token with bytes
    while i < len(body_a) or j < len(body_b):
        if i < len(body_a) and body_a[i] == 0:
            pending_a, i = pending_a + 1, i + 1
        elif j < len(body_b) and body_b[j] == 0:
            pending_b, j = pending_b + 1, j + 1
        else:
            if pos_a <= pos_b:  # a is behind (or level): its next token joins the open chunk
                ca += [chunk] * (pending_a + 1)
                pending_a, pos_a, i = 0, pos_a + body_a[i], i + 1
            else:
                cb += [chunk] * (pending_b + 1)
                pending_b, pos_b, j = 0, pos_b + body_b[j], j + 1
            if pos_a == pos_b:  # a common boundary: the chunk closes
                chunk += 1
    n_content = chunk
    eos = ta > 0 and tb > 0
    end = n_content if eos else n_content - 1
    return ca + [end] * ta, cb + [end] * tb, n_content + int(eos)


# ---- tokenizers -------------------------------------------------------------------------------


@cache
def tokenizer(name: str) -> Any:
    if name == "smollm2":
        return smollm2_tokenizer()
    return tiny.build_tiny_tokenizer(name)


def smollm2_tokenizer() -> Any:
    """SmolLM2's tokenizer from the embedded default's converted directory (no network); skips
    when the embedded model was never converted on this machine (that takes minutes)."""
    from transformers import AutoTokenizer

    from swarm_node.config import ModelConfig
    from swarm_node.policy.models import EMBEDDED_DIR, cache_root

    path = cache_root(ModelConfig()) / EMBEDDED_DIR
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"the embedded SmolLM2 model is not converted at {path}")
    return AutoTokenizer.from_pretrained(path)


ALPHABET = list("0123456789" * 3) + list("  \n\t+-*=()?.,$") + list("abcxyzABC") + list("éü€中😀\u0301ß")


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40)))


def pieces(name: str, text: str) -> tuple[list[int], np.ndarray]:
    tok = tokenizer(name)
    ids = tok.encode(text, add_special_tokens=False)
    lengths = own_piece_bytes(tok, ids, text)
    assert lengths is not None, (name, text)
    return ids, lengths


PAIRS = [("a", "c"), ("b", "c"), ("a", "b"), ("c", "c"), ("smollm2", "c"), ("smollm2", "a")]


@pytest.mark.parametrize(("left", "right"), PAIRS)
def test_alignment_matches_the_reference_on_random_text(left: str, right: str) -> None:
    rng = random.Random(f"{left}-{right}")
    multi_token_chunks = 0
    for _ in range(150):
        text = random_text(rng)
        data = text.encode("utf-8")
        _, a = pieces(left, text)
        _, b = pieces(right, text)
        eos_a, eos_b = rng.random() < 0.5, rng.random() < 0.5  # a trailing EOS on either side
        a = np.append(a, [0] * eos_a)
        b = np.append(b, [0] * eos_b)
        if not data and not (eos_a and eos_b):
            if len(a) or len(b):
                with pytest.raises(AlignmentError):
                    align(a, b)
            continue
        got = align(a, b)
        ref_a, ref_b, ref_n = reference_align(a.tolist(), b.tolist())
        assert got.chunks_a.tolist() == ref_a and got.chunks_b.tolist() == ref_b and got.n_chunks == ref_n
        # every chunk covers the same bytes on both sides, and chunks tile the text in order
        ends_a = np.cumsum(a)
        starts_a = ends_a - a
        ends_b = np.cumsum(b)
        starts_b = ends_b - b
        for c in range(got.n_chunks):
            in_a, in_b = got.chunks_a == c, got.chunks_b == c
            assert in_a.any() and in_b.any()
            span_a = (int(starts_a[in_a].min()), int(ends_a[in_a].max()))
            span_b = (int(starts_b[in_b].min()), int(ends_b[in_b].max()))
            assert span_a == span_b, (text, c)
            multi_token_chunks += int(in_a.sum() > 1 or in_b.sum() > 1)
        assert np.all(np.diff(got.chunks_a) >= 0) and np.all(np.diff(got.chunks_b) >= 0)
    if left != right:
        assert multi_token_chunks > 0  # the tokenizers really differ on this text


def test_same_tokenizer_gives_one_token_per_chunk() -> None:
    rng = random.Random(5)
    for name in ("a", "b", "c"):
        for _ in range(30):
            text = random_text(rng) + "x"
            _, a = pieces(name, text)
            got = align(np.append(a, 0), np.append(a, 0))
            assert got.chunks_a.tolist() == list(range(len(a) + 1)) == got.chunks_b.tolist()
            assert got.eos_chunk


def test_byte_level_pieces_split_a_character_exactly() -> None:
    ids, lengths = pieces("a", "€!")  # tiny a has no merges: one token per byte
    assert len(ids) == 4 and lengths.tolist() == [1, 1, 1, 1]
    ids, lengths = pieces("c", "12 + 345 = 357 €")
    assert sum(lengths) == len("12 + 345 = 357 €".encode()) and len(ids) < 16


# ---- the zero-byte rule -------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b", "chunks_a", "chunks_b", "n", "eos"), [
    ([2, 1, 0], [1, 2, 0], [0, 0, 1], [0, 0, 1], 2, True),  # both EOS: an end chunk
    ([2, 1, 0], [1, 2], [0, 0, 0], [0, 0], 1, False),  # one side only: joins the last chunk
    ([0, 2, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1], 2, False),  # a leading marker joins the next token
    ([1, 0, 2], [1, 2], [0, 1, 1], [0, 1], 2, False),  # a mid zero-byte token joins the next one
    ([0], [0, 0], [0], [0, 0], 1, True),  # no text: only the end chunk
    ([], [], [], [], 0, False),
])
def test_zero_byte_rule(a, b, chunks_a, chunks_b, n, eos) -> None:
    got = align(a, b)
    assert (got.chunks_a.tolist(), got.chunks_b.tolist(), got.n_chunks, got.eos_chunk) == (chunks_a, chunks_b, n, eos)
    assert reference_align(a, b) == (chunks_a, chunks_b, n)


@pytest.mark.parametrize(("a", "b"), [([2, 1], [2]), ([0], []), ([0], [1]), ([1, -1], [0])])
def test_unalignable_streams_raise(a, b) -> None:
    with pytest.raises(AlignmentError):
        align(a, b)


def test_chunk_logprobs_and_shares() -> None:
    got = align([2, 1, 0], [1, 1, 1, 0])  # chunks: bytes 0-2 | byte 2 | EOS
    gen = np.array([-0.5, -0.25, -1.0])
    per_chunk = chunk_logprobs(gen, got.chunks_a, got.n_chunks)
    assert per_chunk.tolist() == [-0.5, -0.25, -1.0]
    shares = last_token_shares(per_chunk, got.chunks_b)
    assert shares.tolist() == [0.0, -0.5, -0.25, -1.0]  # on each chunk's last own token
    assert np.allclose(np.bincount(got.chunks_b, weights=shares), per_chunk)
    own = chunk_logprobs([-0.1, -0.2, -0.3, -0.4], got.chunks_b, got.n_chunks)
    assert np.allclose(own, [-0.3, -0.3, -0.4])
    with pytest.raises(ValueError):
        chunk_logprobs([-0.1], got.chunks_b, got.n_chunks)
