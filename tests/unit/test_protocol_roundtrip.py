"""Round-trip equality of every message type (property-based) and golden bytes of the format."""

from __future__ import annotations

import math

import numpy as np
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol.codec import HEADER_SIZE, Scheme, decode, encode, manifest_signing_bytes, tombstone_signing_bytes
from protocol.messages import (
    Completion,
    IndexEntry,
    NodeStatus,
    PromptChunk,
    PromptRef,
    PromptSetManifest,
    PromptSetTombstone,
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


@st.composite
def completions(draw: st.DrawFn) -> Completion:
    n_tok = draw(st.integers(0, 40))
    n_lp = draw(st.sampled_from([n_tok, n_tok, draw(st.integers(0, 40))]))  # mostly consistent
    tokens = draw(st.lists(st.integers(0, 2**32 - 1), min_size=n_tok, max_size=n_tok))
    lps = draw(st.lists(st.floats(width=32), min_size=n_lp, max_size=n_lp))
    return Completion(
        token_ids=np.array(tokens, dtype=np.uint32), logprobs=np.array(lps, dtype=np.float32),
        finish_reason=draw(st.sampled_from(["stop", "length", "weird"])), claimed_reward=draw(floats),
    )


@st.composite
def groups(draw: st.DrawFn) -> RolloutGroup:
    return RolloutGroup(
        swarm_id=draw(names), sender=draw(names), model_id=draw(names), model_revision=draw(names),
        tokenizer_fingerprint=draw(names), policy_version=draw(ints), created_at=draw(floats),
        prompt=PromptRef(prompt_set_id=draw(names), index=draw(ints), sha256=draw(hex64)),
        sampling=SamplingParams(temperature=draw(floats), top_p=draw(floats), max_new_tokens=draw(ints)),
        completions=draw(st.lists(completions(), max_size=6)),
    )


index_entries = st.builds(
    IndexEntry, chunk_digests=st.lists(hex64, max_size=4), size=nat, prompt_index=ints,
    policy_version=ints, created_at=floats,
)
indexes = st.builds(RolloutIndex, sender=names, window=ints, entries=st.lists(index_entries, max_size=5))
statuses = st.builds(
    NodeStatus, peer_id=names, role=st.sampled_from(["trainer", "observer"]), model_id=names, step=ints,
    timestamp=floats, maddrs=st.lists(names, max_size=4),
    metrics=st.dictionaries(st.text(max_size=20), floats, max_size=12),
)
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
        assert not b.token_ids.flags.writeable and not b.logprobs.flags.writeable


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


def golden_status() -> NodeStatus:
    return NodeStatus(peer_id="QmPeer", role="trainer", model_id="m", step=3, timestamp=12.5,
                      maddrs=("/ip4/127.0.0.1/tcp/4000",), metrics={"reward": 0.5, "accuracy": 0.25})


GOLDEN_GROUP_NONE = (
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
GOLDEN_STATUS_NONE = (
    "534e0103005800000097a6516d50656572a7747261696e6572a16d03cb402900000000000091b72f6970342f3132372e"
    "302e302e312f7463702f3430303082a86163637572616379cb3fd0000000000000a6726577617264cb3fe00000000000"
    "00"
)


def test_golden_group_bytes_uncompressed() -> None:
    assert encode(golden_group(), Scheme.NONE).hex() == GOLDEN_GROUP_NONE
    assert decode(bytes.fromhex(GOLDEN_GROUP_NONE)) == golden_group()


def test_golden_group_bytes_default_scheme() -> None:
    """The default encoding decodes to the golden message; its body (zstd output may differ between
    zstd releases, the body must not) equals the golden body."""
    golden = bytes.fromhex(GOLDEN_GROUP_SHUFFLE_ZSTD)
    assert golden[4] == Scheme.SHUFFLE_ZSTD
    assert decode(golden) == golden_group()
    ours = encode(golden_group())
    assert ours[:HEADER_SIZE] == golden[:HEADER_SIZE]
    unzip = zstandard.ZstdDecompressor().decompress
    assert unzip(ours[HEADER_SIZE:]) == unzip(golden[HEADER_SIZE:])


def test_golden_status_bytes() -> None:
    assert encode(golden_status()).hex() == GOLDEN_STATUS_NONE
    assert decode(bytes.fromhex(GOLDEN_STATUS_NONE)) == golden_status()


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
    data = encode(golden_status())
    assert data[4] == Scheme.NONE
    assert math.isclose(decode(data).metrics["reward"], 0.5)
    assert codec.DEFAULT_SCHEME == Scheme.SHUFFLE_ZSTD
