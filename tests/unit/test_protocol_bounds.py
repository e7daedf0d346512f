"""Bounds stated in bytes: a status record's strings are bounded by their UTF-8 length (a record of
multi-byte characters at the bound is exactly as large as one of ASCII), and a message's body may
decompress to at most its kind's cap (a small status record declaring 16 MiB costs no
decompression at all)."""

from __future__ import annotations

import dataclasses
import random
import struct

import msgpack
import pytest
import zstandard

from protocol import codec, schema
from protocol.codec import Limits, MessageType, Scheme, decode, encode
from protocol.messages import NodeStatus, ProtocolError
from tests.unit.test_receipts_protocol import BYTES_AT_BOUND, MAX_RECORD_BYTES, _at_bound

WIDE = "ЖΩ€𝄞"  # characters of 2, 2, 3 and 4 bytes in UTF-8


def _text_of_bytes(n: int, rng: random.Random) -> str:
    """Random multi-byte characters, exactly `n` bytes UTF-8 encoded."""
    out, size = [], 0
    while size < n:
        fits = [c for c in WIDE if size + len(c.encode()) <= n] or ["x"]
        c = rng.choice(fits)
        out.append(c)
        size += len(c.encode())
    return "".join(out)


def _wide_at_bound() -> NodeStatus:
    """`_at_bound()` with every free-text string (model, addresses, fingerprint, metric keys) made
    of multi-byte characters exactly at its byte bound (peer ids and reasons have ASCII-only rules)."""
    rng = random.Random(1)
    st = _at_bound()
    return dataclasses.replace(
        st, model_id=_text_of_bytes(512, rng), maddrs=tuple(_text_of_bytes(512, rng) for _ in st.maddrs),
        tokenizer_fingerprint=_text_of_bytes(512, rng),
        metrics={_text_of_bytes(64, rng): v for v in st.metrics.values()})


def _frame(kind: MessageType, body: bytes, scheme: Scheme = Scheme.NONE, declared: int | None = None) -> bytes:
    payload = body if scheme == Scheme.NONE else zstandard.ZstdCompressor(level=19, write_checksum=False).compress(body)
    return struct.pack("<2sBBBI", codec.MAGIC, 3, int(kind), int(scheme), len(body) if declared is None else declared) + payload


def test_a_status_record_of_multibyte_strings_at_the_byte_bound_is_no_larger_than_one_of_ascii() -> None:
    st = _wide_at_bound()
    assert len(st.model_id) < 512 and len(st.model_id.encode()) == 512  # fewer characters, same bytes
    data = encode(st, Scheme.NONE)
    assert len(data) <= BYTES_AT_BOUND < MAX_RECORD_BYTES  # the stated bound holds for any characters
    assert decode(data, Limits(max_encoded_bytes=MAX_RECORD_BYTES)) == st


@pytest.mark.parametrize("field", ["model_id", "tokenizer_fingerprint", "maddr", "metric key"])
def test_one_byte_over_the_bound_in_multibyte_characters_is_refused_both_ways(field: str) -> None:
    st = _wide_at_bound()
    over = _text_of_bytes(509, random.Random(2)) + "𝄞"  # 513 bytes, far fewer than 512 characters
    assert len(over.encode()) == 513 and len(over) < 512
    changes = {"model_id": {"model_id": over}, "tokenizer_fingerprint": {"tokenizer_fingerprint": over},
               "maddr": {"maddrs": (over,)}, "metric key": {"metrics": {"é" * 32 + "x": 1.0}}}[field]
    bad = dataclasses.replace(st, **changes)
    with pytest.raises(ProtocolError, match="bytes"):
        encode(bad, Scheme.NONE)  # a node never writes it
    # ... and a reader refuses the same body written by hand (no encoder check in the way)
    wire = schema.to_wire(dataclasses.replace(st, model_id="m"), codec.DEFAULT_LIMITS, shuffle=False)
    fields = {"model_id": 2, "tokenizer_fingerprint": 7, "maddr": 5, "metric key": 6}
    if field == "maddr":
        wire[5] = [over]
    elif field == "metric key":
        wire[6] = {"é" * 32 + "x": 1.0}
    else:
        wire[fields[field]] = over
    with pytest.raises(ProtocolError, match="bytes"):
        decode(_frame(MessageType.NODE_STATUS, msgpack.packb(wire, use_bin_type=True)))


def test_a_small_status_record_declaring_a_large_body_is_refused_before_any_decompression(monkeypatch) -> None:
    body = b"\x00" * (16 << 20)  # the message limit: what any record could declare before
    data = _frame(MessageType.NODE_STATUS, body, Scheme.ZSTD)
    assert len(data) < 2048  # a hostile status record of well under 2 KB
    decompressed: list[int] = []
    real = zstandard.ZstdDecompressor

    class Counting:
        def __init__(self, *a, **k) -> None:
            self._d = real(*a, **k)

        def decompress(self, *a, **k) -> bytes:
            out = self._d.decompress(*a, **k)
            decompressed.append(len(out))
            return out

    monkeypatch.setattr(codec.zstandard, "ZstdDecompressor", Counting)
    with pytest.raises(ProtocolError, match="NODE_STATUS body of 16777216 bytes exceeds 65536"):
        decode(data, Limits(max_encoded_bytes=MAX_RECORD_BYTES))
    assert decompressed == []  # refused from the header: nothing decompressed
    # At the status cap the work is the cap at most (then the body is refused as malformed).
    with pytest.raises(ProtocolError):
        decode(_frame(MessageType.NODE_STATUS, b"\x00" * (64 << 10), Scheme.ZSTD))
    assert decompressed == [64 << 10]
    # The cap is per kind: a rollout group may still declare the message limit.
    with pytest.raises(ProtocolError, match="trailing bytes"):
        decode(_frame(MessageType.ROLLOUT_GROUP, body, Scheme.ZSTD))
    assert decompressed[-1] == 16 << 20


@pytest.mark.parametrize(("kind", "cap"), [("NODE_STATUS", 64 << 10), ("ROLLOUT_INDEX", 1 << 20),
                                           ("PROMPT_SET_MANIFEST", 1 << 20), ("PROMPT_SET_TOMBSTONE", 1 << 20),
                                           ("ROLLOUT_GROUP", 16 << 20), ("PROMPT_CHUNK", 16 << 20)])
def test_each_kind_has_its_decompression_cap(kind: str, cap: int) -> None:
    assert Limits().max_body_bytes(kind) == cap
    assert Limits(max_decoded_bytes=1000).max_body_bytes(kind) == 1000  # never above the message limit
    with pytest.raises(ProtocolError, match="exceeds"):
        decode(_frame(MessageType[kind], b"", declared=cap + 1))


def test_a_status_body_over_its_cap_is_never_written() -> None:
    st = _at_bound()
    with pytest.raises(ProtocolError, match="NodeStatus body of"):
        encode(st, Scheme.NONE, limits=Limits(max_status_bytes=50_000))
