"""Fuzz the decoder: mutated valid encodings and random inputs raise ProtocolError or decode into a
message that validation can judge; never another exception, never a hang."""

from __future__ import annotations

import random
import struct
import time

import msgpack
import numpy as np
import zstandard

from protocol.codec import HEADER_SIZE, Limits, MessageType, Scheme, decode, encode
from protocol.messages import (
    Completion,
    IndexEntry,
    Message,
    NodeStatus,
    PromptChunk,
    PromptRef,
    PromptSetManifest,
    PromptSetTombstone,
    ProtocolError,
    RolloutGroup,
    RolloutIndex,
    SamplingParams,
)
from protocol.validate import ValidationLimits, validate_group, validate_manifest, validate_status, validate_tombstone

N_INPUTS = 12_000
TIME_BOUND_S = 45.0
VLIMITS = ValidationLimits(vocab_size=49_152)


def _seed_messages() -> list[Message]:
    rng = np.random.default_rng(1)
    comps = [
        Completion(token_ids=rng.integers(0, 49_152, n), logprobs=-rng.exponential(0.3, n).astype(np.float32),
                   finish_reason="stop" if n % 2 else "length", claimed_reward=float(n % 2))
        for n in (5, 17, 33, 64)
    ]
    group = RolloutGroup(
        swarm_id="fuzz", sender="QmSender", model_id="m", model_revision="r", tokenizer_fingerprint="fp",
        policy_version=9, created_at=123.5, prompt=PromptRef(prompt_set_id="ps", index=3, sha256="cd" * 32),
        sampling=SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=64), completions=comps,
    )
    texts = ["Caf\u00e9 \u6771\u4eac", "\U0001f600 x\n", "", "42"]
    texted = RolloutGroup(**{**group.__dict__, "completions": [
        Completion(**{**c.__dict__, "text": t, "piece_bytes": _pieces(len(t.encode()), c.token_ids.shape[0])})
        for c, t in zip(comps, texts, strict=True)]})
    return [
        group,
        texted,
        RolloutIndex(sender="QmSender", window=41, entries=[
            IndexEntry(chunk_digests=["ab" * 32, "cd" * 32], size=3000, prompt_index=3, policy_version=9,
                       created_at=123.5)]),
        NodeStatus(peer_id="QmPeer", role="trainer", model_id="m", step=4, timestamp=99.0,
                   maddrs=["/ip4/1.2.3.4/tcp/5"], metrics={"reward": 0.5, "kl": 3.25}),
        PromptSetManifest(prompt_set_id="ps", name="gsm8k", answer_kind="number", num_problems=10,
                          chunk_digests=["ef" * 32], owner_public_key=b"\x01" * 40, created_at=5.0,
                          signature=b"s" * 64),
        PromptChunk(items=[(0, "What is 2+2?", "4"), (1, "What is 3*3?", "9")]),
        PromptSetTombstone(prompt_set_id="ps", owner_public_key=b"\x01" * 40, ended_at=6.0, successor="ps2",
                           signature=b"s" * 64),
    ]


def _pieces(n_bytes: int, n_tokens: int) -> np.ndarray:
    """Piece lengths of n_tokens tokens over n_bytes bytes (the last token takes the rest)."""
    pieces = np.zeros(n_tokens, np.uint16)
    pieces[: min(n_bytes, n_tokens)] = 1
    pieces[-1] += n_bytes - int(pieces.sum())
    return pieces


def _seeds() -> list[bytes]:
    out = []
    for msg in _seed_messages():
        out += [encode(msg, Scheme.NONE), encode(msg, Scheme.ZSTD), encode(msg, Scheme.SHUFFLE_ZSTD)]
    return out


def _frame(body: bytes, kind: int, scheme: Scheme, declared: int | None = None, version: int = 2) -> bytes:
    payload = body if scheme == Scheme.NONE else zstandard.ZstdCompressor().compress(body)
    size = len(body) if declared is None else declared
    return struct.pack("<2sBBBI", b"SN", version, kind, int(scheme), size) + payload


def _mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    data = bytearray(rng.choice(seeds))
    op = rng.randrange(9)
    if op == 0:  # bit flips
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif op == 1:  # truncation
        del data[rng.randrange(len(data)) :]
    elif op == 2:  # insertion
        i = rng.randrange(len(data) + 1)
        data[i:i] = rng.randbytes(rng.randint(1, 16))
    elif op == 3:  # msgpack-significant byte overwrite (container/length headers)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.choice([0x00, 0xFF, 0xC1, 0xC6, 0xDB, 0xDD, 0xDF, 0x9F, 0xCB, 0xC7])
    elif op == 4:  # header field tampering
        data[rng.randrange(HEADER_SIZE)] = rng.randrange(256)
    elif op == 5:  # splice two seeds
        other = rng.choice(seeds)
        data = data[: rng.randrange(len(data))] + other[rng.randrange(len(other)) :]
    elif op == 6:  # mutate the msgpack body, then re-frame (possibly recompressed) so it reaches the schema layer
        body = bytearray(msgpack.packb(msgpack.unpackb(_body(bytes(data)), raw=False), use_bin_type=True))
        for _ in range(rng.randint(1, 4)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        return _frame(bytes(body), data[3], rng.choice([Scheme.NONE, Scheme.ZSTD]), version=rng.choice([1, 2]))
    elif op == 7:  # random well-formed msgpack object under a valid header
        return _frame(msgpack.packb(_random_obj(rng, 3), use_bin_type=True), rng.randint(1, 5), Scheme.NONE,
                      version=rng.choice([1, 2]))
    else:  # a decompression bomb or lying length
        body = b"\x00" * rng.choice([10, 1000, 1 << 20])
        return _frame(body, rng.randint(1, 5), Scheme.ZSTD, declared=rng.choice([None, 5, 1 << 30]))
    return bytes(data)


def _body(data: bytes) -> bytes:
    payload = data[HEADER_SIZE:]
    return payload if data[4] == Scheme.NONE else zstandard.ZstdDecompressor().decompress(payload)


def _random_obj(rng: random.Random, depth: int) -> object:
    choices = [
        lambda: rng.randint(-(2**63), 2**64 - 1), lambda: rng.random() * 1e6, lambda: float("nan"),
        lambda: rng.randbytes(rng.randint(0, 12)), lambda: "s" * rng.randint(0, 8), lambda: None, lambda: True,
    ]
    if depth > 0:
        choices += [lambda: [_random_obj(rng, depth - 1) for _ in range(rng.randint(0, 12))]] * 3
        choices += [lambda: {str(rng.random()): _random_obj(rng, depth - 1) for _ in range(rng.randint(0, 3))}]
    return rng.choice(choices)()


def _check(data: bytes, limits: Limits, outcomes: dict[str, int]) -> None:
    try:
        msg = decode(data, limits)
    except ProtocolError:
        outcomes["rejected"] += 1
        return
    outcomes["decoded"] += 1
    if isinstance(msg, RolloutGroup):
        validate_group(msg, VLIMITS)
    elif isinstance(msg, NodeStatus):
        validate_status(msg, VLIMITS)
    elif isinstance(msg, PromptSetManifest):
        validate_manifest(msg, VLIMITS)
    elif isinstance(msg, PromptSetTombstone):
        validate_tombstone(msg, VLIMITS)
    assert encode(msg, Scheme.NONE, limits=limits)  # whatever decodes re-encodes


def test_fuzz_decoder_raises_only_protocol_error() -> None:
    rng = random.Random(20240601)
    seeds = _seeds()
    limits = Limits(max_decoded_bytes=1 << 20)
    outcomes = {"rejected": 0, "decoded": 0}
    start = time.monotonic()
    for i in range(N_INPUTS):
        if i % 10 == 0:
            data = rng.randbytes(rng.choice([0, 1, 8, 9, 64, 4096]))
            if rng.random() < 0.5:  # random body behind a valid header
                data = struct.pack("<2sBBBI", b"SN", rng.randint(1, 2), rng.randint(1, 6), rng.randint(0, 2),
                                   len(data)) + data
        else:
            data = _mutate(rng, seeds)
        _check(data, limits, outcomes)
    elapsed = time.monotonic() - start
    assert elapsed < TIME_BOUND_S, f"{N_INPUTS} inputs took {elapsed:.1f}s"
    assert outcomes["rejected"] + outcomes["decoded"] == N_INPUTS
    assert outcomes["rejected"] > N_INPUTS // 4  # the mutations do reach the error paths


def test_fuzz_seeds_are_valid() -> None:
    for data, msg in zip(_seeds()[::3], _seed_messages(), strict=True):
        assert decode(data) == msg
    for group in _seed_messages()[:2]:
        assert validate_group(group, VLIMITS) == []


def test_every_message_type_code_rejects_every_other_body() -> None:
    for data in _seeds():
        for kind in MessageType:
            if kind == data[3]:
                continue
            tampered = data[:3] + bytes([kind]) + data[4:]
            try:
                decode(tampered)
            except ProtocolError:
                continue
            raise AssertionError(f"type {data[3]} body decoded as {kind.name}")
