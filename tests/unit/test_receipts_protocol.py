"""Receipts on the wire: the version-3 status body, its bounds, the record's size at every bound,
and validate's reasons for receipts that break them."""

from __future__ import annotations

import dataclasses
import random
import string

import pytest

from protocol import codec
from protocol import validate as v
from protocol.codec import Limits, Scheme, decode, encode
from protocol.messages import (
    EXCHANGE_VERSION,
    MAX_RECEIPT_COUNT,
    MAX_RECEIPT_REASON_LEN,
    MAX_RECEIPT_REASONS,
    MAX_RECEIPTS,
    MAX_RECEIPTS_SPAN_S,
    PROTOCOL_VERSION,
    NodeStatus,
    ProtocolError,
    Receipt,
    RolloutIndex,
)

LIMITS = v.ValidationLimits(vocab_size=1)
B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
MAX_RECORD_BYTES = 64 << 10  # swarm_node.swarm.transport.MAX_RECORD_BYTES (the DHT's owned-record limit)


def receipt(sender: str = "QmSender", **changes) -> Receipt:
    base = Receipt(sender=sender, taken=3, samples=12, gradient=5, filtered=6, filtered_advantage=6, filtered_kl=2,
                   dropped=(("stale", 2), ("tokenizer_mismatch", 1)))
    return dataclasses.replace(base, **changes)


def status(receipts=None, **changes) -> NodeStatus:
    receipts = (receipt(),) if receipts is None else receipts
    base = NodeStatus(peer_id="QmReceiver", role="trainer", model_id="m", step=4, timestamp=100.0,
                      metrics={"reward_mean": 0.5}, tokenizer_fingerprint="fp", receipts_span_s=600.0,
                      receipts=tuple(receipts))
    return dataclasses.replace(base, **changes)


def test_status_records_are_version_3_and_other_messages_stay_at_version_2() -> None:
    assert PROTOCOL_VERSION == 4 and EXCHANGE_VERSION == 2  # version 4 changed the index record only
    assert encode(status())[2] == 3
    assert encode(RolloutIndex(sender="p", window=1, entries=()))[2] == 4  # its entries declare their groups
    assert encode(RolloutIndex(protocol_version=2, sender="p", window=1, entries=()))[2] == 2  # still written and read
    st = status()
    assert decode(encode(st)) == st and decode(encode(st)).receipts[0].dropped == (("stale", 2), ("tokenizer_mismatch", 1))


def test_old_status_records_still_decode_without_receipts() -> None:
    v2 = status(receipts=(), receipts_span_s=0.0, protocol_version=2)
    back = decode(encode(v2))
    assert back.protocol_version == 2 and back.receipts == () and back.tokenizer_fingerprint == "fp"
    v1 = status(receipts=(), receipts_span_s=0.0, protocol_version=1, tokenizer_fingerprint="")
    assert decode(encode(v1)).receipts == ()
    with pytest.raises(ProtocolError, match="version-2 status record cannot carry receipts"):
        encode(status(protocol_version=2))


def test_codec_caps_the_number_of_receipts_and_reasons() -> None:
    many = [receipt(f"QmSender{i}") for i in range(MAX_RECEIPTS + 1)]
    with pytest.raises(ProtocolError, match="receipts"):
        encode(status(receipts=many))
    wordy = receipt(dropped=tuple((f"reason_{i}", 1) for i in range(MAX_RECEIPT_REASONS + 1)))
    with pytest.raises(ProtocolError, match="dropped"):
        encode(status(receipts=[wordy]))
    data = encode(status(receipts=many[:MAX_RECEIPTS]))  # at the cap: written, and a tighter reader refuses it
    with pytest.raises(ProtocolError, match="receipts"):
        decode(data, Limits(max_receipts=MAX_RECEIPTS - 1))
    with pytest.raises(ProtocolError, match="receipt: expected 8 fields"):  # a receipt of the wrong shape
        decode(_reframe(status(), receipts_wire=[["QmSender", 1, 2]]))
    with pytest.raises(ProtocolError, match="taken: expected int"):
        decode(_reframe(status(), receipts_wire=[["QmSender", 1.5, 2, 1, 1, 0, 0, []]]))


def _reframe(st: NodeStatus, receipts_wire) -> bytes:
    """The encoding of `st` with its receipts field replaced by `receipts_wire` (no compression)."""
    import struct

    import msgpack

    from protocol import schema

    wire = schema.to_wire(st, codec.DEFAULT_LIMITS, shuffle=False)
    wire[-1] = receipts_wire
    body = msgpack.packb(wire, use_bin_type=True)
    return struct.pack("<2sBBBI", b"SN", 3, int(codec.MessageType.NODE_STATUS), 0, len(body)) + body


def _at_bound() -> NodeStatus:
    """A status record with every field at its bound, of random (incompressible) characters."""
    rng = random.Random(0)

    def text(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    c = MAX_RECEIPT_COUNT
    receipts = tuple(Receipt(sender=text(128, B58), taken=c, samples=c, gradient=0, filtered=c, filtered_advantage=c,
                             filtered_kl=c, dropped=tuple((text(MAX_RECEIPT_REASON_LEN, string.ascii_lowercase), c)
                                                          for _ in range(MAX_RECEIPT_REASONS)))
                     for _ in range(MAX_RECEIPTS))
    return NodeStatus(peer_id=text(512), role="trainer", model_id=text(512), step=2**63 - 1, timestamp=1e9,
                      maddrs=tuple(text(512) for _ in range(32)), metrics={text(64): rng.random() for _ in range(256)},
                      tokenizer_fingerprint=text(512), receipts_span_s=MAX_RECEIPTS_SPAN_S, receipts=receipts)


# Measured with _at_bound(): the record with receipts at their bound, uncompressed (Scheme.NONE, the
# largest form), and the same record without receipts; both under the DHT's 64 KiB limit.
BYTES_AT_BOUND = 56_287
BYTES_AT_BOUND_WITHOUT_RECEIPTS = 37_277


def test_a_status_record_at_every_bound_fits_the_dht_record_limit() -> None:
    st = _at_bound()
    data = encode(st, Scheme.NONE)
    assert len(data) == BYTES_AT_BOUND < MAX_RECORD_BYTES == 65_536
    assert len(encode(dataclasses.replace(st, receipts=(), receipts_span_s=0.0), Scheme.NONE)) == BYTES_AT_BOUND_WITHOUT_RECEIPTS
    assert len(encode(st)) <= len(data)  # the default scheme never writes more
    assert decode(data, Limits(max_encoded_bytes=MAX_RECORD_BYTES)) == st  # the DHT validators' limits
    assert v.validate_status(st, LIMITS) == []  # a record at the bounds is valid


def test_the_dht_record_limit_matches_the_transport() -> None:
    from swarm_node.swarm.transport import MAX_RECORD_BYTES as TRANSPORT_LIMIT

    assert TRANSPORT_LIMIT == MAX_RECORD_BYTES


@pytest.mark.parametrize(
    ("st", "reason"),
    [
        (status(), None),
        (status(receipts=(), receipts_span_s=0.0), None),
        (status(receipts=[receipt(f"QmS{i}") for i in range(MAX_RECEIPTS + 1)]), v.TOO_MANY_RECEIPTS),
        (status(receipts_span_s=float("nan")), v.BAD_RECEIPT_SPAN),
        (status(receipts_span_s=-1.0), v.BAD_RECEIPT_SPAN),
        (status(receipts_span_s=MAX_RECEIPTS_SPAN_S + 1), v.BAD_RECEIPT_SPAN),
        (status(receipts_span_s=0.0), v.BAD_RECEIPT_SPAN),  # counts over no time
        (status(receipts=[receipt(), receipt()]), v.BAD_RECEIPT_SENDER),  # one sender twice
        (status(receipts=[receipt("QmReceiver")]), v.BAD_RECEIPT_SENDER),  # a receipt for itself
        (status(receipts=[receipt("")]), v.BAD_RECEIPT_SENDER),
        (status(receipts=[receipt("bad id\n")]), v.BAD_RECEIPT_SENDER),
        (status(receipts=[receipt(taken=-1)]), v.BAD_RECEIPT_COUNT),
        (status(receipts=[receipt(samples=MAX_RECEIPT_COUNT + 1)]), v.BAD_RECEIPT_COUNT),
        (status(receipts=[receipt(gradient=7)]), v.BAD_RECEIPT_COUNT),  # gradient + filtered > samples
        (status(receipts=[receipt(filtered_advantage=7)]), v.BAD_RECEIPT_COUNT),  # more than filtered
        (status(receipts=[receipt(filtered_kl=7)]), v.BAD_RECEIPT_COUNT),
        (status(receipts=[receipt(dropped=(("Stale", 1),))]), v.BAD_RECEIPT_REASON),
        (status(receipts=[receipt(dropped=(("x" * (MAX_RECEIPT_REASON_LEN + 1), 1),))]), v.BAD_RECEIPT_REASON),
        (status(receipts=[receipt(dropped=(("stale", 1), ("stale", 2)))]), v.BAD_RECEIPT_REASON),
        (status(receipts=[receipt(dropped=(("stale", 0),))]), v.BAD_RECEIPT_REASON),
        (status(receipts=[receipt(dropped=tuple((f"r{i}", 1) for i in range(MAX_RECEIPT_REASONS + 1)))]),
         v.BAD_RECEIPT_REASON),
    ],
)
def test_validate_reports_each_broken_receipt_rule(st: NodeStatus, reason: str | None) -> None:
    assert v.validate_status(st, LIMITS) == ([] if reason is None else [reason])
    assert reason is None or reason in v.STATUS_REASONS


def test_validate_never_raises_on_decoded_receipts_of_any_value() -> None:
    rng = random.Random(3)
    for _ in range(200):
        r = Receipt(sender=rng.choice(["", "QmA", "é" * 3, "x" * 200]),
                    **{k: rng.choice([-(2**63), -1, 0, 1, 2**40, 2**63 - 1]) for k in
                       ("taken", "samples", "gradient", "filtered", "filtered_advantage", "filtered_kl")},
                    dropped=tuple((rng.choice(["", "ok", "BAD", "a" * 50]), rng.choice([-1, 0, 5])) for _ in range(3)))
        st = status(receipts=[r], receipts_span_s=rng.choice([0.0, 1.0, float("inf"), -5.0]))
        back = decode(encode(st, Scheme.NONE))
        assert isinstance(v.validate_status(back, LIMITS), list)
