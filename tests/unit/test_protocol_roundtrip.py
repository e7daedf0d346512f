"""Round-trip equality of every message type (property-based) and golden bytes of the format."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol.codec import HEADER_SIZE, Scheme, decode, encode, manifest_signing_bytes, tombstone_signing_bytes
from protocol.validate import ValidationLimits, validate_group
from protocol.messages import (
    Completion,
    IndexEntry,
    NodeStatus,
    PromptChunk,
    PromptRef,
    PromptSetManifest,
    PromptSetTombstone,
    Receipt,
    RolloutGroup,
    RolloutIndex,
    SamplingParams,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.text(min_size=0, max_size=40)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
nat = st.integers(min_value=0, max_value=2**63 - 1)
floats = st.floats(allow_nan=True, allow_infinity=True)
hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)


# Completion texts: any unicode, or any bytes (undecodable ones arrive as lone surrogates).
texts = st.one_of(st.text(max_size=60), st.binary(max_size=60).map(lambda b: b.decode("utf-8", "surrogateescape")))


@st.composite
def completions(draw: st.DrawFn, text: bool = True) -> Completion:
    n_tok = draw(st.integers(0, 40))
    n_lp = draw(st.sampled_from([n_tok, n_tok, draw(st.integers(0, 40))]))  # mostly consistent
    tokens = draw(st.lists(st.integers(0, 2**32 - 1), min_size=n_tok, max_size=n_tok))
    lps = draw(st.lists(st.floats(width=32), min_size=n_lp, max_size=n_lp))
    n_pieces = draw(st.sampled_from([0, n_tok, draw(st.integers(0, 40))])) if text else 0
    return Completion(
        token_ids=np.array(tokens, dtype=np.uint32), logprobs=np.array(lps, dtype=np.float32),
        finish_reason=draw(st.sampled_from(["stop", "length", "weird"])), claimed_reward=draw(floats),
        text=draw(texts) if text and draw(st.booleans()) else "",
        piece_bytes=np.array(draw(st.lists(st.integers(0, 2**16 - 1), min_size=n_pieces, max_size=n_pieces)),
                             dtype=np.uint16),
    )


@st.composite
def groups(draw: st.DrawFn) -> RolloutGroup:
    version = draw(st.sampled_from([1, 2, 2]))
    return RolloutGroup(
        protocol_version=version,
        swarm_id=draw(names), sender=draw(names), model_id=draw(names), model_revision=draw(names),
        tokenizer_fingerprint=draw(names), policy_version=draw(ints), created_at=draw(floats),
        prompt=PromptRef(prompt_set_id=draw(names), index=draw(ints), sha256=draw(hex64)),
        sampling=SamplingParams(temperature=draw(floats), top_p=draw(floats), max_new_tokens=draw(ints)),
        completions=draw(st.lists(completions(text=version > 1), max_size=6)),
    )


index_entries = st.builds(
    IndexEntry, chunk_digests=st.lists(hex64, max_size=4), size=nat, prompt_index=ints,
    policy_version=ints, created_at=floats,
)
declared_entries = st.builds(  # version 4: each entry declares its group's tokenizer, text and G
    IndexEntry, chunk_digests=st.lists(hex64, max_size=4), size=nat, prompt_index=ints,
    policy_version=ints, created_at=floats, tokenizer_fingerprint=names, has_text=st.booleans(),
    group_size=st.integers(0, 256),
)
indexes = st.one_of(
    st.builds(RolloutIndex, sender=names, window=ints, entries=st.lists(declared_entries, max_size=5)),
    st.builds(RolloutIndex, protocol_version=st.sampled_from([1, 2, 3]), sender=names, window=ints,
              entries=st.lists(index_entries, max_size=5)),
)
receipts = st.builds(
    Receipt, sender=names, taken=ints, samples=ints, gradient=ints, filtered=ints, filtered_advantage=ints,
    filtered_kl=ints, dropped=st.lists(st.tuples(names, ints), max_size=8),
)
statuses = st.one_of(st.builds(
    NodeStatus, peer_id=names, role=st.sampled_from(["trainer", "observer"]), model_id=names, step=ints,
    timestamp=floats, maddrs=st.lists(names, max_size=4),
    metrics=st.dictionaries(st.text(max_size=20), floats, max_size=12), tokenizer_fingerprint=names,
    receipts_span_s=floats, receipts=st.lists(receipts, max_size=4),
), st.builds(
    NodeStatus, protocol_version=st.just(2), peer_id=names, role=st.sampled_from(["trainer", "observer"]),
    model_id=names, step=ints, timestamp=floats, tokenizer_fingerprint=names,
), st.builds(
    NodeStatus, protocol_version=st.just(1), peer_id=names, role=st.sampled_from(["trainer", "observer"]),
    model_id=names, step=ints, timestamp=floats, maddrs=st.lists(names, max_size=4),
))
manifests = st.builds(
    PromptSetManifest, prompt_set_id=names, name=names, answer_kind=st.sampled_from(["number", "math"]),
    num_problems=ints, chunk_digests=st.lists(hex64, max_size=5), owner_public_key=st.binary(max_size=300),
    created_at=floats, signature=st.binary(max_size=300),
)
chunks = st.builds(
    PromptChunk, items=st.lists(st.tuples(ints, st.text(max_size=200), st.text(max_size=50)), max_size=8)
)
tombstones = st.builds(
    PromptSetTombstone, prompt_set_id=names, owner_public_key=st.binary(max_size=300), ended_at=floats,
    successor=names, signature=st.binary(max_size=300),
)
messages = st.one_of(groups(), indexes, statuses, manifests, chunks, tombstones)


@SETTINGS
@given(msg=messages, scheme=st.sampled_from([None, *Scheme]))
def test_round_trip_equality(msg, scheme) -> None:
    data = encode(msg, scheme)
    back = decode(data)
    assert type(back) is type(msg)
    assert back == msg
    assert encode(back, scheme) == data  # canonical: re-encoding gives the same bytes


@SETTINGS
@given(group=groups())
def test_group_round_trip_preserves_arrays_bitwise(group) -> None:
    back = decode(encode(group))
    for a, b in zip(group.completions, back.completions, strict=True):
        assert a.token_ids.dtype == b.token_ids.dtype == np.uint32
        assert a.logprobs.dtype == b.logprobs.dtype == np.float32
        assert a.token_ids.tobytes() == b.token_ids.tobytes()
        assert a.logprobs.tobytes() == b.logprobs.tobytes()
        assert b.piece_bytes.dtype == np.uint16 and a.piece_bytes.tobytes() == b.piece_bytes.tobytes()
        assert a.text == b.text
        assert not b.token_ids.flags.writeable and not b.logprobs.flags.writeable and not b.piece_bytes.flags.writeable
    reasons = validate_group(back, ValidationLimits(vocab_size=2**32))  # judges any text, never raises
    if any(c.has_text and c.text and not c.piece_bytes.size for c in back.completions):
        assert "text_pieces_mismatch" in reasons


def test_completion_equality_is_exact() -> None:
    base = Completion(token_ids=[1, 2], logprobs=[-0.5, float("nan")], finish_reason="stop", claimed_reward=1.0)
    same = Completion(token_ids=[1, 2], logprobs=[-0.5, float("nan")], finish_reason="stop", claimed_reward=1.0)
    other = Completion(token_ids=[1, 3], logprobs=[-0.5, float("nan")], finish_reason="stop", claimed_reward=1.0)
    assert base == same and base != other


def golden_group() -> RolloutGroup:
    return RolloutGroup(
        swarm_id="golden", sender="QmSender", model_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        model_revision="main", tokenizer_fingerprint="fp0123", policy_version=7, created_at=1700000000.25,
        prompt=PromptRef(prompt_set_id="gsm8k-train", index=42, sha256="ab" * 32),
        sampling=SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=8),
        completions=(
            Completion(token_ids=[1, 300, 49151], logprobs=[-0.125, -2.5, -0.0], finish_reason="stop",
                       claimed_reward=1.0),
            Completion(token_ids=[7, 7], logprobs=[-1.0, -3.75], finish_reason="length", claimed_reward=0.0),
        ),
    )


def golden_group_with_text() -> RolloutGroup:
    g = golden_group()
    first, second = g.completions
    return RolloutGroup(**{**g.__dict__, "completions": (
        Completion(**{**first.__dict__, "text": "Caf\u00e9", "piece_bytes": [2, 3, 0]}),  # the eos has no bytes
        Completion(**{**second.__dict__, "text": "\u6771", "piece_bytes": [1, 2]}),  # one character, two tokens
    )})


def golden_status() -> NodeStatus:
    return NodeStatus(peer_id="QmPeer", role="trainer", model_id="m", step=3, timestamp=12.5,
                      maddrs=("/ip4/127.0.0.1/tcp/4000",), metrics={"reward": 0.5, "accuracy": 0.25})


GOLDEN_GROUP_NONE = (  # version 1; version 2 without text: see golden_v2_hex
    "534e010100010100009ca6676f6c64656ea8516d53656e646572d92348756767696e674661636554422f536d6f6c4c4d"
    "322d3133354d2d496e737472756374a46d61696ea666703031323307cb41d954fc4010000093ab67736d386b2d747261"
    "696e2ad94061626162616261626162616261626162616261626162616261626162616261626162616261626162616261"
    "62616261626162616261626162616261626162616293cb3ff0000000000000cb3fee6666666666660892940303a47374"
    "6f70cb3ff0000000000000940202a66c656e677468cb0000000000000000c414010000002c010000ffbf000007000000"
    "07000000c414000000be000020c000000080000080bf000070c0"
)
GOLDEN_GROUP_SHUFFLE_ZSTD = (
    "534e0101020101000028b52ffd6001009c040034089ca6676f6c64656ea8516d53656e646572d92348756767696e6746"
    "61636554422f536d6f6c4c4d322d3133354d2d496e737472756374a46d61696ea666703031323307cb41d954fc401000"
    "0093ab67736d386b2d747261696e2ad940616293cb3ff00000cb3fee66660892940303a473746f70940202a66c656e67"
    "7468cb000000c41405004f09ffb310080d82f296e4cc280000012cff07072800000001bf000028000000000000003800"
    "000000000000c414280000000000000028000000000000002800000020008070280000bec080bfc0010000"
)
GOLDEN_GROUP_TEXT_NONE = (  # version 2: the adapter digest ("", a0) follows the revision
    "534e0201001c0100009fa6676f6c64656ea8516d53656e646572d92348756767696e674661636554422f536d6f6c4c4d"
    "322d3133354d2d496e737472756374a46d61696ea0a666703031323307cb41d954fc4010000093ab67736d386b2d7472"
    "61696e2ad940616261626162616261626162616261626162616261626162616261626162616261626162616261626162"
    "6162616261626162616261626162616261626162616293cb3ff0000000000000cb3fee6666666666660892960303a473"
    "746f70cb3ff00000000000000503960202a66c656e677468cb00000000000000000302c414010000002c010000ffbf00"
    "000700000007000000c414000000be000020c000000080000080bf000070c0c408436166c3a9e69db1c40a0200030000"
    "0001000200"
)
GOLDEN_STATUS_V2_NONE = (
    "534e0203005f00000098a6516d50656572a7747261696e6572a16d03cb402900000000000091b72f6970342f3132372e"
    "302e302e312f7463702f3430303082a86163637572616379cb3fd0000000000000a6726577617264cb3fe00000000000"
    "00a6667030313233"
)
GOLDEN_STATUS_V3_NONE = (  # version 3: receipts_span_s and one receipt follow the fingerprint
    "534e030300810000009aa6516d50656572a7747261696e6572a16d03cb402900000000000091b72f6970342f3132372e"
    "302e302e312f7463702f3430303082a86163637572616379cb3fd0000000000000a6726577617264cb3fe00000000000"
    "00a6667030313233cb4082c000000000009198a7516d4f746865720208030404019192a57374616c6501"
)
GOLDEN_STATUS_NONE = (  # version 1
    "534e0103005800000097a6516d50656572a7747261696e6572a16d03cb402900000000000091b72f6970342f3132372e"
    "302e302e312f7463702f3430303082a86163637572616379cb3fd0000000000000a6726577617264cb3fe00000000000"
    "00"
)


def v1(msg):
    return type(msg)(**{**msg.__dict__, "protocol_version": 1})


def test_golden_group_bytes_uncompressed() -> None:
    assert encode(v1(golden_group()), Scheme.NONE).hex() == GOLDEN_GROUP_NONE
    assert decode(bytes.fromhex(GOLDEN_GROUP_NONE)) == v1(golden_group())  # version 1 is still read
    v2_hex = golden_v2_hex(GOLDEN_GROUP_NONE)
    assert encode(golden_group(), Scheme.NONE).hex() == v2_hex
    assert decode(bytes.fromhex(v2_hex)) == golden_group()
    digest = "cd" * 32  # a LoRA sender's adapter: the 64 characters as a str 8 (d9 40) after the revision
    with_adapter = RolloutGroup(**{**golden_group().__dict__, "adapter_digest": digest})
    assert encode(with_adapter, Scheme.NONE).hex() == golden_v2_hex(GOLDEN_GROUP_NONE, "d940" + digest.encode().hex())
    assert decode(encode(with_adapter)).adapter_digest == digest


def golden_v2_hex(v1_hex: str, adapter: str = "a0") -> str:
    """The version-2 bytes of a version-1 group without text: version byte 2, one more body field
    (array 0x9c -> 0x9d), the adapter digest (msgpack str; "" is a0) after the revision "main"."""
    body = v1_hex[18:]
    cut = body.index("a46d61696e") + len("a46d61696e")
    length = int.from_bytes(bytes.fromhex(v1_hex[10:18]), "little") + len(adapter) // 2
    return v1_hex[:4] + "02" + v1_hex[6:10] + length.to_bytes(4, "little").hex() + "9d" + body[2:cut] + adapter + body[cut:]


def test_golden_group_with_text_bytes() -> None:
    assert encode(golden_group_with_text(), Scheme.NONE).hex() == GOLDEN_GROUP_TEXT_NONE
    back = decode(bytes.fromhex(GOLDEN_GROUP_TEXT_NONE))
    assert back == golden_group_with_text()
    assert [c.text for c in back.completions] == ["Caf\u00e9", "\u6771"]
    assert [c.piece_bytes.tolist() for c in back.completions] == [[2, 3, 0], [1, 2]]
    data = encode(golden_group_with_text())
    assert data[4] == Scheme.SHUFFLE_ZSTD and decode(data) == golden_group_with_text()


def test_golden_group_bytes_default_scheme() -> None:
    """The default encoding decodes to the golden message; its body (zstd output may differ between
    zstd releases, the body must not) equals the golden body."""
    golden = bytes.fromhex(GOLDEN_GROUP_SHUFFLE_ZSTD)
    assert golden[4] == Scheme.SHUFFLE_ZSTD
    assert decode(golden) == v1(golden_group())
    ours = encode(v1(golden_group()))
    assert ours[:HEADER_SIZE] == golden[:HEADER_SIZE]
    unzip = zstandard.ZstdDecompressor().decompress
    assert unzip(ours[HEADER_SIZE:]) == unzip(golden[HEADER_SIZE:])


def test_golden_status_bytes() -> None:
    assert encode(v1(golden_status())).hex() == GOLDEN_STATUS_NONE
    assert decode(bytes.fromhex(GOLDEN_STATUS_NONE)) == v1(golden_status())
    fingerprinted = NodeStatus(**{**golden_status().__dict__, "tokenizer_fingerprint": "fp0123",
                                  "protocol_version": 2})
    assert encode(fingerprinted).hex() == GOLDEN_STATUS_V2_NONE
    assert decode(bytes.fromhex(GOLDEN_STATUS_V2_NONE)) == fingerprinted
    receipt = Receipt(sender="QmOther", taken=2, samples=8, gradient=3, filtered=4, filtered_advantage=4,
                      filtered_kl=1, dropped=(("stale", 1),))
    with_receipts = NodeStatus(**{**fingerprinted.__dict__, "protocol_version": 3, "receipts_span_s": 600.0,
                                  "receipts": (receipt,)})
    assert encode(with_receipts, Scheme.NONE).hex() == GOLDEN_STATUS_V3_NONE
    assert decode(bytes.fromhex(GOLDEN_STATUS_V3_NONE)) == with_receipts


def test_manifest_signing_bytes_exclude_signature() -> None:
    m = PromptSetManifest(prompt_set_id="p", name="n", answer_kind="number", num_problems=2,
                          chunk_digests=("0" * 64,), owner_public_key=b"key", created_at=1.0, signature=b"sig1")
    other_sig = PromptSetManifest(**{**m.__dict__, "signature": b"another"})
    assert manifest_signing_bytes(m) == manifest_signing_bytes(other_sig)
    assert b"sig1" not in manifest_signing_bytes(m)
    changed = PromptSetManifest(**{**m.__dict__, "num_problems": 3})
    assert manifest_signing_bytes(changed) != manifest_signing_bytes(m)


def test_tombstone_signing_bytes_exclude_signature_and_differ_from_a_manifest() -> None:
    t = PromptSetTombstone(prompt_set_id="p", owner_public_key=b"key", ended_at=2.0, signature=b"sig1")
    assert tombstone_signing_bytes(t) == tombstone_signing_bytes(PromptSetTombstone(**{**t.__dict__, "signature": b"x"}))
    assert b"sig1" not in tombstone_signing_bytes(t)
    assert tombstone_signing_bytes(PromptSetTombstone(**{**t.__dict__, "successor": "q"})) != tombstone_signing_bytes(t)
    m = PromptSetManifest(prompt_set_id="p", name="n", answer_kind="number", num_problems=2,
                          chunk_digests=("0" * 64,), owner_public_key=b"key", created_at=2.0)
    assert manifest_signing_bytes(m)[3] != tombstone_signing_bytes(t)[3]  # the type byte keeps them apart


def test_default_scheme_falls_back_to_none_for_small_records() -> None:
    data = encode(dataclasses.replace(golden_status(), protocol_version=2))
    assert data[4] == Scheme.NONE
    assert math.isclose(decode(data).metrics["reward"], 0.5)
    assert codec.DEFAULT_SCHEME == Scheme.SHUFFLE_ZSTD
