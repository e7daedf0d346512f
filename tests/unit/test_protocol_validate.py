"""One test per validation rule: a message breaking exactly that rule is rejected with its reason."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protocol import validate as v
from protocol.codec import decode, encode
from protocol.messages import (
    Completion,
    NodeStatus,
    PromptRef,
    PromptSetManifest,
    ProtocolError,
    RolloutGroup,
    SamplingParams,
)

LIMITS = v.ValidationLimits(vocab_size=1000, max_tokens_per_completion=16, max_group_size=4)


def completion(tokens=(1, 2, 3), logprobs=(-0.1, -2.0, -0.0), finish="stop", text="", pieces=()) -> Completion:
    return Completion(token_ids=np.array(tokens, np.uint32), logprobs=np.array(logprobs, np.float32),
                      finish_reason=finish, claimed_reward=1.0, text=text, piece_bytes=np.array(pieces, np.uint16))


def texted(text: str = "x = 4\n", pieces=(2, 4, 0)) -> tuple[Completion, Completion]:
    """Two completions carrying `text` (3 tokens; the last, an eos, has no bytes by default)."""
    return (completion(text=text, pieces=pieces),) * 2


def group(**changes) -> RolloutGroup:
    base = RolloutGroup(
        swarm_id="s", sender="p", model_id="m", model_revision="r", tokenizer_fingerprint="fp", policy_version=1,
        created_at=10.0, prompt=PromptRef(prompt_set_id="ps", index=0, sha256="0" * 64),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16), completions=(completion(),) * 2,
    )
    return dataclasses.replace(base, **changes)


def reasons(g: RolloutGroup, limits: v.ValidationLimits = LIMITS) -> list[str]:
    return v.validate_group(decode(encode(g)), limits)  # through the wire, as a node sees it


def test_valid_group_has_no_reasons() -> None:
    assert reasons(group()) == []


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"protocol_version": 99}, v.BAD_VERSION),
        ({"completions": ()}, v.EMPTY_GROUP),
        ({"completions": (completion(),) * 5}, v.GROUP_TOO_LARGE),
        ({"completions": (completion(tokens=(), logprobs=()),)}, v.EMPTY_COMPLETION),
        ({"completions": (completion(tokens=range(17), logprobs=[-1.0] * 17),)}, v.TOO_MANY_TOKENS),
        ({"completions": (completion(tokens=(1, 1000, 2)),)}, v.TOKEN_OUT_OF_VOCAB),
        ({"completions": (completion(logprobs=(-0.1, -0.2)),)}, v.LENGTH_MISMATCH),
        ({"completions": (completion(logprobs=(-0.1, float("nan"), -1.0)),)}, v.LOGPROB_NONFINITE),
        ({"completions": (completion(logprobs=(-0.1, float("-inf"), -1.0)),)}, v.LOGPROB_NONFINITE),
        ({"completions": (completion(logprobs=(-0.1, 0.5, -1.0)),)}, v.LOGPROB_POSITIVE),
        ({"completions": (completion(finish="abort"),)}, v.BAD_FINISH_REASON),
        ({"sampling": SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=16)}, v.BAD_SAMPLING),
        ({"sampling": SamplingParams(temperature=1.0, top_p=1.5, max_new_tokens=16)}, v.BAD_SAMPLING),
        ({"sampling": SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=2)}, v.TOO_MANY_TOKENS),
        ({"sampling": SamplingParams(temperature=0.2, top_p=1.0, max_new_tokens=16)}, v.UNSUPPORTED_TEMPERATURE),
        ({"sampling": SamplingParams(temperature=2.5, top_p=1.0, max_new_tokens=16)}, v.UNSUPPORTED_TEMPERATURE),
        ({"sampling": SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=16)}, v.UNSUPPORTED_TOP_P),
        ({"prompt": PromptRef(prompt_set_id="ps", index=0, sha256="XYZ")}, v.BAD_PROMPT_REF),
        ({"prompt": PromptRef(prompt_set_id="ps", index=-1, sha256="0" * 64)}, v.BAD_PROMPT_REF),
        ({"created_at": float("nan")}, v.BAD_TIMESTAMP),
        ({"policy_version": -1}, v.BAD_POLICY_VERSION),
        ({"completions": texted("caf\udce9", (2, 2, 0))}, v.TEXT_INVALID_UTF8),  # b"caf\xe9": latin-1, not UTF-8
        ({"completions": texted(pieces=(2, 3, 0))}, v.TEXT_PIECES_MISMATCH),  # adds up to 5 of 6 bytes
        ({"completions": texted(pieces=(6, 0))}, v.TEXT_PIECES_MISMATCH),  # 2 pieces for 3 tokens
        ({"completions": texted(pieces=())}, v.TEXT_PIECES_MISMATCH),  # text without pieces
        ({"completions": texted("", (0, 0, 0, 0))}, v.TEXT_PIECES_MISMATCH),  # pieces without text
        ({"completions": texted("x" * 97, (32, 32, 33))}, v.TEXT_TOO_LONG),  # over 32 bytes a token
        ({"completions": texted("x\x1b[2J", (2, 3, 0))}, v.TEXT_FORBIDDEN_CHAR),  # terminal escape
        ({"completions": texted("x\x00y", (2, 1, 0))}, v.TEXT_FORBIDDEN_CHAR),
        ({"completions": texted("x\x85y", (2, 2, 0))}, v.TEXT_FORBIDDEN_CHAR),  # a C1 control
        ({"completions": texted("\u6771\ufffd", (3, 3, 0))}, v.TEXT_FORBIDDEN_CHAR),  # a lossy decode
        ({"completions": (completion(), completion(text="x", pieces=(1, 0, 0)))}, v.TEXT_PARTIAL),
    ],
)
def test_group_rule(changes: dict, reason: str) -> None:
    g = group(**changes)
    got = v.validate_group(g, LIMITS) if "protocol_version" in changes else reasons(g)
    assert got == [reason]


def test_bad_version_cannot_even_be_encoded() -> None:
    with pytest.raises(ProtocolError, match="protocol version"):
        encode(group(protocol_version=99))


def test_honest_text_is_accepted() -> None:
    assert reasons(group(completions=texted())) == []
    unicode = "Caf\u00e9 \u6771\u4eac \U0001f600\t\r\n"  # 20 bytes over 3 tokens; tab, CR, LF allowed
    assert reasons(group(completions=texted(unicode, (7, 13, 0)))) == []
    assert reasons(group(completions=texted("", (0, 0, 0)))) == []  # only special tokens: empty text
    assert reasons(group(completions=texted("x" * 96, (32, 32, 32)))) == []  # exactly at the cap
    limits = dataclasses.replace(LIMITS, max_text_bytes_per_token=31)
    assert reasons(group(completions=texted("x" * 96, (32, 32, 32))), limits) == [v.TEXT_TOO_LONG]


def test_group_too_small() -> None:
    assert reasons(group(), dataclasses.replace(LIMITS, min_group_size=3)) == [v.GROUP_TOO_SMALL]


def test_wrong_swarm_and_tokenizer() -> None:
    limits = dataclasses.replace(LIMITS, expected_swarm_id="other", expected_tokenizer_fingerprint="fp2")
    assert reasons(group(), limits) == [v.WRONG_SWARM, v.TOKENIZER_MISMATCH]
    matching = dataclasses.replace(LIMITS, expected_swarm_id="s", expected_tokenizer_fingerprint="fp")
    assert reasons(group(), matching) == []


def test_each_reason_is_listed_once_in_stable_order() -> None:
    bad = completion(tokens=(5000, 1), logprobs=(1.0, float("nan"), 2.0), finish="x")
    got = reasons(group(completions=(bad, bad)))
    assert got == [v.LENGTH_MISMATCH, v.TOKEN_OUT_OF_VOCAB, v.LOGPROB_NONFINITE, v.LOGPROB_POSITIVE,
                   v.BAD_FINISH_REASON]
    assert set(v.GROUP_REASONS) >= set(got)


def status(**changes) -> NodeStatus:
    base = NodeStatus(peer_id="p", role="trainer", model_id="m", step=2, timestamp=3.0, maddrs=(),
                      metrics={"reward": 0.5})
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, None),
        ({"protocol_version": 5}, v.BAD_VERSION),
        ({"protocol_version": 1}, None),  # version 1 is still read
        ({"role": "admin"}, v.BAD_ROLE),
        ({"step": -3}, v.BAD_STEP),
        ({"timestamp": float("inf")}, v.BAD_TIMESTAMP),
        ({"metrics": {f"m{i}": 1.0 for i in range(300)}}, v.TOO_MANY_METRICS),
        ({"metrics": {"k" * 65: 1.0}}, v.METRIC_KEY_TOO_LONG),
        ({"metrics": {"reward": float("nan")}}, v.METRIC_NONFINITE),
    ],
)
def test_status_rule(changes: dict, reason: str | None) -> None:
    assert v.validate_status(status(**changes), LIMITS) == ([] if reason is None else [reason])


def manifest(**changes) -> PromptSetManifest:
    base = PromptSetManifest(prompt_set_id="ps", name="n", answer_kind="math", num_problems=5,
                             chunk_digests=("a" * 64,), owner_public_key=b"owner", created_at=1.0, signature=b"sig")
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, None),
        ({"protocol_version": 0}, v.BAD_VERSION),
        ({"answer_kind": "text"}, v.BAD_ANSWER_KIND),
        ({"num_problems": 0}, v.BAD_NUM_PROBLEMS),
        ({"chunk_digests": ()}, v.NO_CHUNKS),
        ({"chunk_digests": ("A" * 64,)}, v.BAD_CHUNK_DIGEST),
        ({"created_at": -5.0}, v.BAD_TIMESTAMP),
        ({"signature": b""}, v.UNSIGNED),
        ({"owner_public_key": b"intruder"}, v.WRONG_OWNER),
    ],
)
def test_manifest_rule(changes: dict, reason: str | None) -> None:
    limits = dataclasses.replace(LIMITS, expected_owner=b"owner")
    assert v.validate_manifest(manifest(**changes), limits) == ([] if reason is None else [reason])


def test_reason_names_are_unique_short_identifiers() -> None:
    names = set(v.GROUP_REASONS) | set(v.STATUS_REASONS) | set(v.MANIFEST_REASONS)
    assert all(n.isidentifier() and n.islower() and len(n) <= 24 for n in names)
    constants = {val for key, val in vars(v).items() if key.isupper() and isinstance(val, str)}
    assert names == constants


def test_another_tokenizer_is_taken_only_with_text_and_without_the_vocab_bound() -> None:
    cross = dataclasses.replace(LIMITS, expected_tokenizer_fingerprint="mine", cross_tokenizer=True, vocab_size=3)
    with_text = group(tokenizer_fingerprint="theirs", completions=texted())
    assert reasons(with_text, cross) == []  # its token ids (up to 3) are the sender's: no vocab bound
    assert reasons(group(tokenizer_fingerprint="theirs"), cross) == [v.TOKENIZER_MISMATCH]  # no text
    assert reasons(with_text, dataclasses.replace(cross, cross_tokenizer=False)) == [v.TOKENIZER_MISMATCH]
    own = group(tokenizer_fingerprint="mine", completions=texted())
    assert reasons(own, cross) == [v.TOKEN_OUT_OF_VOCAB]  # the receiver's own tokens keep the bound


def test_adapter_digest_is_empty_or_a_sha256_hex() -> None:
    assert reasons(group(adapter_digest="")) == []
    assert reasons(group(adapter_digest="0f" * 32)) == []
    for bad in ["0F" * 32, "ab" * 31, "x" * 64, "main"]:
        assert reasons(group(adapter_digest=bad)) == [v.BAD_ADAPTER_DIGEST]
