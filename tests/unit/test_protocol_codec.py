"""Codec bounds and hostile inputs, DHT keys, chunk helpers and the rollout file format."""

from __future__ import annotations

import ast
import dataclasses
import struct
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zstandard

from protocol import keys
from protocol.codec import (
    Limits,
    Scheme,
    content_digest,
    decode,
    encode,
    read_rollout_file,
    split_chunks,
    write_rollout_file,
)
from protocol.messages import Completion, NodeStatus, PromptRef, ProtocolError, RolloutGroup, SamplingParams


def make_group(n_comp: int = 3, n_tok: int = 10, seed: int = 0) -> RolloutGroup:
    rng = np.random.default_rng(seed)
    return RolloutGroup(
        swarm_id="s", sender="p", model_id="m", model_revision="r", tokenizer_fingerprint="fp", policy_version=1,
        created_at=10.0, prompt=PromptRef(prompt_set_id="ps", index=seed, sha256="0" * 64),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=n_tok),
        completions=[Completion(token_ids=rng.integers(0, 100, n_tok), logprobs=-rng.random(n_tok),
                                finish_reason="stop", claimed_reward=0.0) for _ in range(n_comp)],
    )


def frame(body: bytes, kind: int = 1, scheme: int = 0, version: int = 1, declared: int | None = None) -> bytes:
    size = len(body) if declared is None else declared
    return struct.pack("<2sBBBI", b"SN", version, kind, scheme, size) + body


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "truncated"),
        (b"SN\x01", "truncated"),
        (b"XX" + bytes(20), "bad magic"),
        (frame(b"\x90", version=5), "unsupported protocol version 5"),
        (frame(b"\x90", kind=9), "unknown message type 9"),
        (frame(b"\x90", scheme=7), "unknown compression scheme 7"),
        (frame(b"\x90", declared=1 << 31), "exceeds"),
        (frame(b"\x90\x90"), "trailing"),
        (frame(b"\xdd\xff\xff\xff\xff"), "truncated msgpack"),
        (frame(b"\x9c" + b"\xc0" * 12), "expected array, got NoneType"),
        (frame(b"\x91\x91\xc0", kind=5), "item: expected array"),
    ],
)
def test_bad_bytes_raise_protocol_error(data: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(data)


def test_wrong_input_type() -> None:
    with pytest.raises(ProtocolError, match="expected bytes"):
        decode("SN")  # type: ignore[arg-type]


def test_decompression_bomb_is_refused_without_inflating() -> None:
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\x00" * (64 << 20))
    assert len(bomb) < 10_000
    with pytest.raises(ProtocolError, match="exceeds"):  # the header cannot declare 64 MiB
        decode(frame(bomb, scheme=Scheme.ZSTD, declared=64 << 20))
    with pytest.raises(ProtocolError, match="declares"):  # nor lie about it
        decode(frame(bomb, scheme=Scheme.ZSTD, declared=100))
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x90")
    with pytest.raises(ProtocolError, match="declares"):
        decode(frame(unsized, scheme=Scheme.ZSTD, declared=1))


def test_nested_container_flood_is_refused_before_unpacking() -> None:
    body = b"\xdc\xff\xff" + b"\x90" * 0xFFFF  # one array of 65535 empty arrays
    with pytest.raises(ProtocolError, match="more than 1000 msgpack objects"):
        decode(frame(body), Limits(max_objects=1000))


def test_limits_bound_counts_and_sizes() -> None:
    group = make_group(n_comp=5, n_tok=20)
    data = encode(group)
    for limits, match in [
        (Limits(max_completions=4), "completions"),
        (Limits(max_tokens_per_completion=19), "n_tokens"),
        (Limits(max_total_tokens=99), "exceeds 99"),
        (Limits(max_string_len=0), "exceeds 0"),
        (Limits(max_encoded_bytes=len(data) - 1), "exceeds"),
    ]:
        with pytest.raises(ProtocolError, match=match):
            decode(data, limits)
        with pytest.raises(ProtocolError):  # we never write what a peer with these limits refuses
            encode(group, limits=limits)
    status = NodeStatus(peer_id="p", role="trainer", model_id="m", step=1, timestamp=1.0,
                        metrics={f"k{i}": 1.0 for i in range(10)})
    with pytest.raises(ProtocolError, match="max_map_len"):
        decode(encode(status), Limits(max_metrics=9))


def test_encode_rejects_unwritable_messages() -> None:
    with pytest.raises(ProtocolError, match="not a protocol message"):
        encode(object())  # type: ignore[arg-type]
    base = make_group()
    for bad in [{"policy_version": 2**64}, {"created_at": "now"}, {"sender": "\ud800"}, {"swarm_id": 5}]:
        with pytest.raises(ProtocolError):
            encode(RolloutGroup(**{**base.__dict__, **bad}))
    with pytest.raises(ProtocolError, match="uint32"):
        Completion(token_ids=[-1], logprobs=[0.0], finish_reason="stop", claimed_reward=0.0)
    with pytest.raises(ProtocolError, match="1-D"):
        Completion(token_ids=np.zeros((2, 2)), logprobs=[0.0], finish_reason="stop", claimed_reward=0.0)


def with_text(group: RolloutGroup, text: str = "ab\u00e9") -> RolloutGroup:
    """`group` with `text` on every completion, its bytes attributed to the first tokens."""
    n = len(text.encode("utf-8", "surrogatepass"))
    comps = []
    for c in group.completions:
        pieces = np.zeros(c.token_ids.shape[0], np.uint16)
        pieces[: min(n, pieces.size)] = 1
        pieces[-1] += n - int(pieces.sum())
        comps.append(dataclasses.replace(c, text=text, piece_bytes=pieces))
    return dataclasses.replace(group, completions=comps)


def test_text_fields_travel_only_when_sent() -> None:
    plain = make_group(n_comp=4, n_tok=50)
    texted = with_text(plain, "caf\u00e9 \u6771\u4eac \U0001f600\n")
    for scheme in Scheme:
        assert decode(encode(texted, scheme)) == texted
        assert decode(encode(plain, scheme)) == plain
    body = msgpack.unpackb(encode(plain, Scheme.NONE)[9:])
    assert len(body) == 13 and body[4] == "" and all(len(h) == 4 for h in body[10])  # v1 body + adapter digest
    v1 = dataclasses.replace(plain, protocol_version=1)
    v1_body = msgpack.unpackb(encode(v1, Scheme.NONE)[9:])
    assert v1_body == body[:4] + body[5:] and encode(v1, Scheme.NONE)[2] == 1 and encode(plain, Scheme.NONE)[2] == 2
    assert decode(encode(v1)) == v1
    body = msgpack.unpackb(encode(texted, Scheme.NONE)[9:])
    assert len(body) == 15 and all(len(h) == 6 for h in body[10])
    assert body[13] == "caf\u00e9 \u6771\u4eac \U0001f600\n".encode() * 4
    assert np.frombuffer(body[14], "<u2").sum() == len(body[13])


def test_adapter_digest_travels_in_version_2_only() -> None:
    digest = "ab" * 32
    group = dataclasses.replace(make_group(n_comp=2), adapter_digest=digest)
    for scheme in Scheme:
        back = decode(encode(group, scheme))
        assert back == group and back.adapter_digest == digest
        texted = with_text(group)
        assert decode(encode(texted, scheme)).adapter_digest == digest
    assert msgpack.unpackb(encode(group, Scheme.NONE)[9:])[4] == digest
    with pytest.raises(ProtocolError, match="version-1 group cannot carry an adapter digest"):
        encode(dataclasses.replace(group, protocol_version=1))
    assert decode(encode(dataclasses.replace(group, protocol_version=1, adapter_digest=""))).adapter_digest == ""
    body = msgpack.unpackb(encode(group, Scheme.NONE)[9:])
    body[4] = 7
    with pytest.raises(ProtocolError, match="adapter_digest: expected str"):
        decode(frame(msgpack.packb(body, use_bin_type=True), version=2))
    with pytest.raises(ProtocolError, match="expected 12 fields"):  # a version-2 body read as version 1
        decode(frame(msgpack.packb(body, use_bin_type=True), version=1))


def test_text_needs_version_2_and_consistent_byte_strings() -> None:
    texted = with_text(make_group())
    with pytest.raises(ProtocolError, match="version-1 group"):
        encode(dataclasses.replace(texted, protocol_version=1))
    with pytest.raises(ProtocolError, match="version-1 status"):
        encode(NodeStatus(protocol_version=1, peer_id="p", role="trainer", model_id="m", step=1, timestamp=1.0,
                          tokenizer_fingerprint="fp"))
    body = msgpack.unpackb(encode(texted, Scheme.NONE)[9:])
    for mutate, match in [
        (lambda b: b.__setitem__(13, b[13][:-1]), "text/piece byte strings"),
        (lambda b: b.__setitem__(14, b[14] + b"\x00\x00"), "piece bytes"),
        (lambda b: [h.__setitem__(slice(4, 6), [0, 0]) for h in b[10]] and b.__setitem__(13, b"")
         or b.__setitem__(14, b""), "no completion carries text"),  # non-canonical: fields must be left out
        (lambda b: b[10][0].pop(), "expected 6 fields"),
        (lambda b: b.pop(), "expected 13 fields"),
    ]:
        tampered = msgpack.unpackb(msgpack.packb(body, use_bin_type=True))
        mutate(tampered)
        with pytest.raises(ProtocolError, match=match):
            decode(frame(msgpack.packb(tampered, use_bin_type=True), version=2))
    with pytest.raises(ProtocolError, match="expected 12 fields"):  # version 1 never had text
        decode(frame(msgpack.packb(body, use_bin_type=True), version=1))
    with pytest.raises(ProtocolError, match="uint16"):
        Completion(token_ids=[1], logprobs=[0.0], finish_reason="stop", claimed_reward=0.0, piece_bytes=[70_000])
    with pytest.raises(ProtocolError, match="text must be a str"):
        Completion(token_ids=[1], logprobs=[0.0], finish_reason="stop", claimed_reward=0.0, text=b"x")
    with pytest.raises(ProtocolError, match="UTF-8"):  # a lone surrogate no UTF-8 byte stands for
        encode(with_text(make_group(), "\ud800"))


def test_undecodable_text_round_trips_byte_for_byte() -> None:
    body = msgpack.unpackb(encode(with_text(make_group(n_comp=1), "abc"), Scheme.NONE)[9:])
    body[13] = b"a\xffc"  # not UTF-8: kept as a lone surrogate, which validate rejects
    data = frame(msgpack.packb(body, use_bin_type=True), version=2)
    back = decode(data)
    assert back.completions[0].text == "a\udcffc"
    assert encode(back, Scheme.NONE) == data


def test_compression_schemes_are_lossless_and_default_is_smallest() -> None:
    group = make_group(n_comp=8, n_tok=256)
    sizes = {s: len(encode(group, s)) for s in Scheme}
    for s in Scheme:
        assert decode(encode(group, s)) == group
    assert sizes[Scheme.SHUFFLE_ZSTD] == min(sizes.values()) < sizes[Scheme.NONE]
    raw = sizes[Scheme.NONE]
    assert raw <= 8.5 * group.num_tokens  # headers included
    assert encode(group)[4] == Scheme.SHUFFLE_ZSTD


def test_zstd_payload_must_be_exactly_one_frame() -> None:
    data = encode(make_group(), Scheme.ZSTD)
    with pytest.raises(ProtocolError, match="frame"):
        decode(data + b"\x00")
    with pytest.raises(ProtocolError):
        decode(data[:-1])


def test_chunks_and_digest(tmp_path: Path) -> None:
    data = encode(make_group(n_comp=4, n_tok=200))
    parts = split_chunks(data, 1000)
    assert len(parts) == -(-len(data) // 1000) and all(len(p) <= 1000 for p in parts)
    assert b"".join(parts) == data
    assert content_digest(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    with pytest.raises(ProtocolError):
        split_chunks(data, 0)


def test_rollout_file_round_trip(tmp_path: Path) -> None:
    groups = [make_group(seed=i) for i in range(4)]
    path = tmp_path / "rollouts.bin"
    assert write_rollout_file(path, [groups[0], encode(groups[1]), *groups[2:]]) == 4
    assert list(read_rollout_file(path)) == groups
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ProtocolError, match="truncated"):
        list(read_rollout_file(path))
    path.write_bytes(b"junk")
    with pytest.raises(ProtocolError, match="magic"):
        list(read_rollout_file(path))


def test_keys() -> None:
    assert keys.rollout_index_key("my-swarm", 12) == "swarm-node/my-swarm/rollouts/12"
    assert keys.chunk_key("s", "a" * 64) == f"swarm-node/s/chunk/{'a' * 64}"
    assert keys.status_key("s.1", 3) == "swarm-node/s.1/status/3"
    assert keys.status_keys("s") == [f"swarm-node/s/status/{i}" for i in range(keys.STATUS_SHARDS)]
    for shard in [-1, keys.STATUS_SHARDS, True, 1.0, "1", None]:
        with pytest.raises(ProtocolError, match="status shard"):
            keys.status_key("s", shard)  # type: ignore[arg-type]
    assert keys.prompt_manifest_key("s", "gsm8k_v1") == "swarm-node/s/prompts/gsm8k_v1"
    assert keys.window_of(59.9, 30.0) == 1 and keys.window_of(60.0, 30.0) == 2 and keys.window_of(0, 5) == 0
    for bad in ["", "a/b", "-x", "a" * 65, "sp ace", "é", None]:
        with pytest.raises(ProtocolError, match="swarm id"):
            keys.status_key(bad, 0)  # type: ignore[arg-type]
    for digest in ["A" * 64, "a" * 63, "../" + "a" * 61, 5]:
        with pytest.raises(ProtocolError, match="digest"):
            keys.chunk_key("s", digest)  # type: ignore[arg-type]
    for window in [-1, 1.5, True, 2**63]:
        with pytest.raises(ProtocolError, match="window"):
            keys.rollout_index_key("s", window)  # type: ignore[arg-type]
    for t, w in [(float("nan"), 1.0), (1.0, 0.0), (-1.0, 1.0), ("x", 1.0), (1e300, 1e-300)]:
        with pytest.raises(ProtocolError):
            keys.window_of(t, w)  # type: ignore[arg-type]


def test_protocol_imports_only_stdlib_msgpack_numpy_zstandard() -> None:
    allowed = {"msgpack", "numpy", "zstandard", "protocol"} | set(sys.stdlib_module_names)
    for path in Path("protocol").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                assert name.split(".")[0] in allowed, f"{path} imports {name}"
    assert msgpack.version >= (1, 0)


def test_index_entries_declare_their_groups_from_version_4() -> None:
    """Version 4: an entry declares its group's tokenizer, text and G; older indexes declare nothing
    and still decode (a receiver fetches their groups as before); an older layout cannot declare."""
    from protocol.messages import IndexEntry, RolloutIndex

    declared = IndexEntry(chunk_digests=("ab" * 32,), size=100, prompt_index=3, policy_version=1, created_at=5.0,
                          tokenizer_fingerprint="fp-a", has_text=True, group_size=12)
    data = encode(RolloutIndex(sender="p", window=1, entries=(declared,)))
    back = decode(data)
    assert data[2] == 4 and back.entries == (declared,) and back.entries[0].declared
    old = dataclasses.replace(declared, tokenizer_fingerprint="", has_text=False, group_size=0)
    v2 = decode(encode(RolloutIndex(protocol_version=2, sender="p", window=1, entries=(old,))))
    assert v2.protocol_version == 2 and v2.entries == (old,) and not v2.entries[0].declared
    with pytest.raises(ProtocolError, match="version-2 index entry cannot declare"):
        encode(RolloutIndex(protocol_version=2, sender="p", window=1, entries=(declared,)))
    entry = [["ab" * 32], 100, 3, 1, 5.0]
    for version, fields, match in [(4, entry, "entry: expected 8 fields, got 5"),  # a version-4 entry of 5 fields
                                   (2, [*entry, "fp", True, 4], "entry: expected 5 fields, got 8"),
                                   (4, [*entry, "fp", 1, 4], "has_text: expected bool"),
                                   (4, [*entry, "fp", True, -1], "group_size: -1 outside")]:
        body = msgpack.packb(["p", 1, [fields]], use_bin_type=True)
        with pytest.raises(ProtocolError, match=match):
            decode(frame(body, kind=2, version=version))
    with pytest.raises(ProtocolError, match="has_text must be a bool"):
        IndexEntry(chunk_digests=(), size=0, prompt_index=0, policy_version=0, created_at=0.0, has_text=1)
