"""Semantic checks of decoded messages: return the reasons a message is rejected (empty = accept).

Never raises on a message built by `codec.decode` (or any message whose fields have the declared
types); the node counts drops by these reason identifiers, which are stable strings.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from protocol.messages import (
    ANSWER_KINDS,
    FINISH_REASONS,
    MAX_RECEIPT_COUNT,
    MAX_RECEIPT_REASON_LEN,
    MAX_RECEIPT_REASONS,
    MAX_RECEIPTS,
    MAX_RECEIPTS_SPAN_S,
    NODE_ROLES,
    SUPPORTED_VERSIONS,
    NodeStatus,
    PromptSetManifest,
    PromptSetTombstone,
    Receipt,
    RolloutGroup,
)

# Reasons (stable identifiers; the node counts drops under these names).
BAD_VERSION = "bad_version"
EMPTY_GROUP = "empty_group"
GROUP_TOO_SMALL = "group_too_small"
GROUP_TOO_LARGE = "group_too_large"
EMPTY_COMPLETION = "empty_completion"
TOO_MANY_TOKENS = "too_many_tokens"
TOKEN_OUT_OF_VOCAB = "token_out_of_vocab"
LENGTH_MISMATCH = "length_mismatch"
LOGPROB_NONFINITE = "logprob_nonfinite"
LOGPROB_POSITIVE = "logprob_positive"
LOGPROB_BELOW_FLOOR = "logprob_below_floor"
UNSUPPORTED_TOP_P = "unsupported_top_p"
UNSUPPORTED_TEMPERATURE = "unsupported_temperature"
BAD_FINISH_REASON = "bad_finish_reason"
BAD_SAMPLING = "bad_sampling"
BAD_PROMPT_REF = "bad_prompt_ref"
BAD_ADAPTER_DIGEST = "bad_adapter_digest"  # neither "" nor 64 lowercase hex
BAD_TIMESTAMP = "bad_timestamp"
BAD_POLICY_VERSION = "bad_policy_version"
WRONG_SWARM = "wrong_swarm"
TOKENIZER_MISMATCH = "tokenizer_mismatch"
TEXT_INVALID_UTF8 = "text_invalid_utf8"
TEXT_PIECES_MISMATCH = "text_pieces_mismatch"
TEXT_TOO_LONG = "text_too_long"
TEXT_FORBIDDEN_CHAR = "text_forbidden_char"
TEXT_PARTIAL = "text_partial"
BAD_ROLE = "bad_role"
BAD_STEP = "bad_step"
TOO_MANY_METRICS = "too_many_metrics"
METRIC_KEY_TOO_LONG = "metric_key_too_long"
METRIC_NONFINITE = "metric_nonfinite"
TOO_MANY_RECEIPTS = "too_many_receipts"
BAD_RECEIPT_SPAN = "bad_receipt_span"  # not finite, negative, over MAX_RECEIPTS_SPAN_S, or receipts with span 0
BAD_RECEIPT_SENDER = "bad_receipt_sender"  # empty, not a peer id's characters, repeated, or the record's own peer
BAD_RECEIPT_COUNT = "bad_receipt_count"  # negative, over MAX_RECEIPT_COUNT, or breaking the Receipt invariants
BAD_RECEIPT_REASON = "bad_receipt_reason"  # too many, repeated, not [a-z0-9_]{1,40}, or a count < 1
BAD_ANSWER_KIND = "bad_answer_kind"
BAD_NUM_PROBLEMS = "bad_num_problems"
BAD_CHUNK_DIGEST = "bad_chunk_digest"
NO_CHUNKS = "no_chunks"
UNSIGNED = "unsigned"
WRONG_OWNER = "wrong_owner"

GROUP_REASONS = (
    BAD_VERSION, EMPTY_GROUP, GROUP_TOO_SMALL, GROUP_TOO_LARGE, EMPTY_COMPLETION, TOO_MANY_TOKENS, TOKEN_OUT_OF_VOCAB,
    LENGTH_MISMATCH, LOGPROB_NONFINITE, LOGPROB_POSITIVE, LOGPROB_BELOW_FLOOR, BAD_FINISH_REASON, BAD_SAMPLING,
    UNSUPPORTED_TOP_P, UNSUPPORTED_TEMPERATURE, BAD_PROMPT_REF, BAD_ADAPTER_DIGEST, BAD_TIMESTAMP, BAD_POLICY_VERSION, WRONG_SWARM, TOKENIZER_MISMATCH,
    TEXT_INVALID_UTF8, TEXT_PIECES_MISMATCH, TEXT_TOO_LONG, TEXT_FORBIDDEN_CHAR, TEXT_PARTIAL,
)
STATUS_REASONS = (
    BAD_VERSION, BAD_ROLE, BAD_STEP, BAD_TIMESTAMP, TOO_MANY_METRICS, METRIC_KEY_TOO_LONG, METRIC_NONFINITE,
    TOO_MANY_RECEIPTS, BAD_RECEIPT_SPAN, BAD_RECEIPT_SENDER, BAD_RECEIPT_COUNT, BAD_RECEIPT_REASON,
)
MANIFEST_REASONS = (
    BAD_VERSION, BAD_ANSWER_KIND, BAD_NUM_PROBLEMS, NO_CHUNKS, BAD_CHUNK_DIGEST, BAD_TIMESTAMP, UNSIGNED, WRONG_OWNER,
)

TOMBSTONE_REASONS = (BAD_VERSION, BAD_TIMESTAMP, UNSIGNED, WRONG_OWNER)

_HEX64 = re.compile(r"[0-9a-f]{64}")
_PEER_ID = re.compile(r"[0-9A-Za-z._:-]{1,128}")  # base58 libp2p ids, and the ids of in-memory swarms
_REASON = re.compile(f"[a-z0-9_]{{1,{MAX_RECEIPT_REASON_LEN}}}")

# The logprob floor. A sampled token's logprob below -50 means the sampler drew an event of
# probability under e^-50 ~ 2e-22: with vocabularies of 1e5-1e6 tokens and any realistic number of
# samples that does not happen, so such a value can only be fabricated (or a broken generator). It
# is also what keeps the receiver's numerics safe: pi_theta/pi_gen stays within reach of the
# objective's log-ratio clamp (swarm_node.method.objective.LOG_RATIO_BOUND) instead of overflowing.
MIN_LOGPROB = -50.0

# The sampling temperatures a receiver supports by default (declared in `SamplingParams`; logprobs
# are log softmax(logits / temperature) of the sender's model). Every configuration shipped here
# samples at 1.0 and RL practice stays within 0.6-1.2. Above the range an honest logprob may sit
# far below what any receiver's policy assigns the token (a flattened distribution), so a group
# could legitimately put every token's importance weight at its truncation C, the influence a
# forged low logprob buys; below it a logprob recomputed from the sender's model (a spot-check)
# carries the backends' logit differences amplified by 1 / temperature, and samples are
# near-greedy. Configurable per node (`swarm.min_peer_temperature`, `swarm.max_peer_temperature`).
MIN_TEMPERATURE = 0.25
MAX_TEMPERATURE = 2.0

# Completion text (cross-tokenizer exchange; `messages.Completion`). A token is about 4 bytes of
# text on average; the longest tokens of common vocabularies are 60-130 bytes. The cap bounds a
# receiver's re-tokenization work by the token count it already accepts; a completion made mostly
# of the longest tokens (degenerate runs of spaces or dashes) is dropped.
MAX_TEXT_BYTES_PER_TOKEN = 32

# Characters a completion text may not hold: C0 controls other than tab, newline and carriage
# return, DEL and the C1 controls (no tokenizer of a chat model emits them in answers; they are
# terminal and log injection), and U+FFFD: the sender decodes its tokens' exact bytes, so a
# replacement character means a lossy decode whose pieces no longer match the bytes its tokens
# produced (a token holding part of a multi-byte character decodes to U+FFFD on its own), or a
# sender that cut a character in two. Lone surrogates are text_invalid_utf8 (see Completion).
_FORBIDDEN_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffd]")
_SURROGATES = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class ValidationLimits:
    """What a receiving node accepts. `vocab_size` is the receiver's tokenizer's (a token id >= it
    cannot be scored); the optional expectations turn on the swarm and tokenizer checks."""

    vocab_size: int
    max_tokens_per_completion: int = 4_096
    max_group_size: int = 64
    min_group_size: int = 1
    versions: frozenset[int] = SUPPORTED_VERSIONS
    expected_swarm_id: str | None = None
    expected_tokenizer_fingerprint: str | None = None
    max_metrics: int = 256
    max_metric_key_len: int = 64
    expected_owner: bytes | None = None
    min_logprob: float = MIN_LOGPROB
    min_temperature: float = MIN_TEMPERATURE  # declared sampling temperatures outside [min, max]
    max_temperature: float = MAX_TEMPERATURE  # are `unsupported_temperature`
    max_text_bytes_per_token: int = MAX_TEXT_BYTES_PER_TOKEN  # a completion's text: at most this x its tokens
    # Another tokenizer's group is taken when every completion carries its text (the receiver
    # re-tokenizes it; its token ids are then the sender's, not checked against `vocab_size`).
    cross_tokenizer: bool = False


def _add(reasons: list[str], reason: str) -> None:
    if reason not in reasons:
        reasons.append(reason)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_group(group: RolloutGroup, limits: ValidationLimits) -> list[str]:
    """Reasons to reject `group` (empty list: accept), each listed once, in a stable order."""
    reasons: list[str] = []
    if group.protocol_version not in limits.versions:
        _add(reasons, BAD_VERSION)
    if limits.expected_swarm_id is not None and group.swarm_id != limits.expected_swarm_id:
        _add(reasons, WRONG_SWARM)
    fp = limits.expected_tokenizer_fingerprint
    foreign = fp is not None and group.tokenizer_fingerprint != fp
    if foreign and not (limits.cross_tokenizer and group.completions and all(c.has_text for c in group.completions)):
        _add(reasons, TOKENIZER_MISMATCH)
    if not _finite(group.created_at) or group.created_at < 0:
        _add(reasons, BAD_TIMESTAMP)
    if not isinstance(group.policy_version, int) or group.policy_version < 0:
        _add(reasons, BAD_POLICY_VERSION)
    p, s = group.prompt, group.sampling
    if not (isinstance(p.index, int) and p.index >= 0 and isinstance(p.sha256, str) and _HEX64.fullmatch(p.sha256)):
        _add(reasons, BAD_PROMPT_REF)
    if not (isinstance(group.adapter_digest, str) and (group.adapter_digest == "" or _HEX64.fullmatch(group.adapter_digest))):
        _add(reasons, BAD_ADAPTER_DIGEST)
    if not (_finite(s.temperature) and s.temperature > 0 and _finite(s.top_p) and 0 < s.top_p <= 1
            and isinstance(s.max_new_tokens, int) and s.max_new_tokens >= 1):
        _add(reasons, BAD_SAMPLING)
    else:
        if s.top_p != 1.0:
            # Logprobs are defined as the tempered, untruncated distribution (the quantity the trainer
            # scores); under top_p < 1 backends disagree on them (vLLM renormalises the nucleus).
            _add(reasons, UNSUPPORTED_TOP_P)
        if not limits.min_temperature <= s.temperature <= limits.max_temperature:
            _add(reasons, UNSUPPORTED_TEMPERATURE)
    n = len(group.completions)
    if n == 0:
        _add(reasons, EMPTY_GROUP)
    elif n < limits.min_group_size:
        _add(reasons, GROUP_TOO_SMALL)
    if n > limits.max_group_size:
        _add(reasons, GROUP_TOO_LARGE)
    max_tokens = limits.max_tokens_per_completion
    if isinstance(s.max_new_tokens, int) and s.max_new_tokens >= 1:
        max_tokens = min(max_tokens, s.max_new_tokens)
    for c in group.completions:
        _check_completion(c.token_ids, c.logprobs, c.finish_reason, max_tokens, limits, reasons, foreign)
    texts = [c.has_text for c in group.completions]
    if any(texts) and not all(texts):
        _add(reasons, TEXT_PARTIAL)  # groups are whole: a receiver that needs text could use only part
    for c in group.completions:
        if c.has_text:
            for reason in text_reasons(c.text, c.piece_bytes, int(c.token_ids.shape[0]), limits):
                _add(reasons, reason)
    return reasons


def text_reasons(text: str, piece_bytes: np.ndarray, n_tokens: int, limits: ValidationLimits) -> list[str]:
    """Reasons to reject one completion's text and pieces (empty: accept): valid UTF-8, one piece
    per token adding up to the text's bytes, within the size cap, no forbidden characters. Senders
    check their own text with it before sending."""
    reasons: list[str] = []
    if _SURROGATES.search(text):
        _add(reasons, TEXT_INVALID_UTF8)
    n_bytes = _utf8_len(text)
    if int(piece_bytes.shape[0]) != n_tokens or int(piece_bytes.sum(dtype=np.int64)) != n_bytes:
        _add(reasons, TEXT_PIECES_MISMATCH)
    if n_bytes > limits.max_text_bytes_per_token * max(n_tokens, 1):
        _add(reasons, TEXT_TOO_LONG)
    if _FORBIDDEN_CHARS.search(text):
        _add(reasons, TEXT_FORBIDDEN_CHAR)
    return reasons


def first_forbidden_char(text: str) -> int:
    """Index of the first character of `text` a completion text may not hold, len(text) when none
    (senders trim a completion to the text before it: `swarm_node.policy.pieces.faithful_prefix`)."""
    m = _FORBIDDEN_CHARS.search(text)
    return m.start() if m else len(text)


def _check_completion(
    token_ids: np.ndarray, logprobs: np.ndarray, finish_reason: str, max_tokens: int, limits: ValidationLimits,
    reasons: list[str], foreign: bool = False,
) -> None:
    vocab_size = limits.vocab_size
    n_tok, n_lp = int(token_ids.shape[0]), int(logprobs.shape[0])
    if n_tok == 0:
        _add(reasons, EMPTY_COMPLETION)
    if n_tok != n_lp:
        _add(reasons, LENGTH_MISMATCH)
    if max(n_tok, n_lp) > max_tokens:
        _add(reasons, TOO_MANY_TOKENS)
    if n_tok and not foreign and int(token_ids.max()) >= vocab_size:
        _add(reasons, TOKEN_OUT_OF_VOCAB)
    if n_lp:
        finite = np.isfinite(logprobs)
        if not finite.all():
            _add(reasons, LOGPROB_NONFINITE)
        if (logprobs[finite] > 0).any():
            _add(reasons, LOGPROB_POSITIVE)
        if (logprobs[finite] < limits.min_logprob).any():
            _add(reasons, LOGPROB_BELOW_FLOOR)
    if finish_reason not in FINISH_REASONS:
        _add(reasons, BAD_FINISH_REASON)


def _utf8_len(text: str) -> int:
    """Bytes of `text` on the wire (undecodable bytes kept as U+DC80-U+DCFF count one each); never
    raises, also for a locally built string with other lone surrogates."""
    try:
        return len(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return len(text.encode("utf-8", "surrogatepass"))


def validate_status(status: NodeStatus, limits: ValidationLimits) -> list[str]:
    """Reasons to reject a node status record (empty list: accept)."""
    reasons: list[str] = []
    if status.protocol_version not in limits.versions:
        _add(reasons, BAD_VERSION)
    if status.role not in NODE_ROLES:
        _add(reasons, BAD_ROLE)
    if not isinstance(status.step, int) or status.step < 0:
        _add(reasons, BAD_STEP)
    if not _finite(status.timestamp) or status.timestamp < 0:
        _add(reasons, BAD_TIMESTAMP)
    if len(status.metrics) > limits.max_metrics:
        _add(reasons, TOO_MANY_METRICS)
    for key, value in status.metrics.items():
        if len(key) > limits.max_metric_key_len:
            _add(reasons, METRIC_KEY_TOO_LONG)
        if not _finite(value):
            _add(reasons, METRIC_NONFINITE)
    for reason in receipt_reasons(status):
        _add(reasons, reason)
    return reasons


def receipt_reasons(status: NodeStatus) -> list[str]:
    """Reasons to reject a status record's receipts (empty: accept; see `messages.Receipt`)."""
    reasons: list[str] = []
    span = status.receipts_span_s
    if not _finite(span) or not 0 <= span <= MAX_RECEIPTS_SPAN_S or (status.receipts and span == 0):
        _add(reasons, BAD_RECEIPT_SPAN)
    if len(status.receipts) > MAX_RECEIPTS:
        _add(reasons, TOO_MANY_RECEIPTS)
    senders = [r.sender for r in status.receipts]
    if len(set(senders)) != len(senders) or status.peer_id in senders:
        _add(reasons, BAD_RECEIPT_SENDER)
    for r in status.receipts:
        if not (isinstance(r.sender, str) and _PEER_ID.fullmatch(r.sender)):
            _add(reasons, BAD_RECEIPT_SENDER)
        if not _receipt_counts_ok(r):
            _add(reasons, BAD_RECEIPT_COUNT)
        names = [k for k, _ in r.dropped]
        if (len(r.dropped) > MAX_RECEIPT_REASONS or len(set(names)) != len(names)
                or not all(isinstance(k, str) and _REASON.fullmatch(k) and _count(n) and n >= 1 for k, n in r.dropped)):
            _add(reasons, BAD_RECEIPT_REASON)
    return reasons


def _count(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_RECEIPT_COUNT


def _receipt_counts_ok(r: Receipt) -> bool:
    counts = (r.taken, r.samples, r.gradient, r.filtered, r.filtered_advantage, r.filtered_kl)
    return (all(_count(n) for n in counts) and r.gradient + r.filtered <= r.samples
            and r.filtered_advantage <= r.filtered and r.filtered_kl <= r.filtered)


def validate_manifest(manifest: PromptSetManifest, limits: ValidationLimits) -> list[str]:
    """Reasons to reject a prompt-set manifest (empty list: accept). The signature itself is
    checked by the transport, which holds the crypto; here: present, and from the expected owner."""
    reasons: list[str] = []
    if manifest.protocol_version not in limits.versions:
        _add(reasons, BAD_VERSION)
    if manifest.answer_kind not in ANSWER_KINDS:
        _add(reasons, BAD_ANSWER_KIND)
    if not isinstance(manifest.num_problems, int) or manifest.num_problems < 1:
        _add(reasons, BAD_NUM_PROBLEMS)
    if not manifest.chunk_digests:
        _add(reasons, NO_CHUNKS)
    if any(not isinstance(d, str) or _HEX64.fullmatch(d) is None for d in manifest.chunk_digests):
        _add(reasons, BAD_CHUNK_DIGEST)
    if not _finite(manifest.created_at) or manifest.created_at < 0:
        _add(reasons, BAD_TIMESTAMP)
    if not manifest.signature:
        _add(reasons, UNSIGNED)
    if limits.expected_owner is not None and manifest.owner_public_key != limits.expected_owner:
        _add(reasons, WRONG_OWNER)
    return reasons


def validate_tombstone(tombstone: PromptSetTombstone, limits: ValidationLimits) -> list[str]:
    """Reasons to reject a prompt-set tombstone (empty list: accept). As for manifests, the signature
    itself is checked where the crypto lives; here: present, and from the expected owner."""
    reasons: list[str] = []
    if tombstone.protocol_version not in limits.versions:
        _add(reasons, BAD_VERSION)
    if not _finite(tombstone.ended_at) or tombstone.ended_at < 0:
        _add(reasons, BAD_TIMESTAMP)
    if not tombstone.signature:
        _add(reasons, UNSIGNED)
    if limits.expected_owner is not None and tombstone.owner_public_key != limits.expected_owner:
        _add(reasons, WRONG_OWNER)
    return reasons
