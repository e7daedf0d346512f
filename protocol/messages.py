"""Every wire type peers exchange, in one module.

Frozen dataclasses of flat primitives (str, int, float, bytes, tuples of those, 1-D numpy arrays).
Construction only normalises *types* (lists become tuples, arrays become read-only 1-D arrays of the
wire dtype) so that a received message can always be represented, even a semantically bad one: the
semantic rules (vocabulary, finite logprobs, consistent lengths, ...) live in `protocol.validate`,
which reports rejection reasons instead of raising. Build messages with keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

PROTOCOL_VERSION = 4
"""The newest version this code writes. Every message carries its version; a node refuses others.

Version 2 added a completion's `text` and `piece_bytes` (cross-tokenizer exchange), a group's
`adapter_digest` (the declared model, for logprob spot-checks) and a status record's
`tokenizer_fingerprint`. Version 3 added a status record's receipts (`NodeStatus.receipts`,
`receipts_span_s`). Version 4 added an index entry's declaration of its group
(`IndexEntry.tokenizer_fingerprint`, `has_text`, `group_size`), so a receiver can skip a group it
cannot use without downloading it. Each changed one body only, so each message is written at the
newest version that changed its body: index records at `INDEX_VERSION` (4), status records at
`STATUS_VERSION` (3), groups and prompt-set records at `EXCHANGE_VERSION` (2). A version-4 node
reads the indexes of version-2 and 3 nodes (their entries declare nothing: it fetches them as
before); a version-2 or 3 node refuses a version-4 index as `bad_version` (its decoder knows no
entry of 8 fields), so nodes of those versions take no group of a version-4 node: upgrade a swarm
together. An older decoder would refuse a newer body as malformed (its field counts are exact), not
misread it; the version says which layout a body has, so a node that does not know it refuses it
as `bad_version` rather than as garbage."""

EXCHANGE_VERSION = 2
"""The version groups and prompt-set records are written at: their layout is the same in versions
2, 3 and 4 (version 3 changed the status record only, version 4 the index record only)."""

STATUS_VERSION = 3
"""The version status records are written at (version 4 did not change their layout)."""

INDEX_VERSION = 4
"""The version rollout index records are written at: their entries declare their groups."""

SUPPORTED_VERSIONS: frozenset[int] = frozenset({1, EXCHANGE_VERSION, STATUS_VERSION, INDEX_VERSION})
"""Versions this code can decode (and encode: a message declaring version 1 is written in the
version-1 layout, which cannot carry completion text or a status fingerprint; a status record
declaring version 1 or 2 cannot carry receipts; an index of versions 1-3 declares nothing)."""

FINISH_REASONS: tuple[str, ...] = ("stop", "length")
NODE_ROLES: tuple[str, ...] = ("trainer", "observer")
ANSWER_KINDS: tuple[str, ...] = ("number", "math")


class ProtocolError(ValueError):
    """The one exception the protocol raises for bad input.

    Raised by `codec.decode` for any bytes that are not a well-formed message within the limits
    (truncated, wrong types, oversized, unknown version or type, decompression bombs, random bytes),
    by `codec.encode` for a message that cannot be written, by `keys` for bad key parts, and by the
    message constructors when a field has the wrong *type*. Subclasses ValueError.
    """


def _as_tuple(value: Any, name: str) -> tuple[Any, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ProtocolError(f"{name} must be a sequence, got {type(value).__name__}")
    return tuple(value)


def _wire_array(value: Any, dtype: type, name: str) -> np.ndarray:
    """A read-only 1-D array of `dtype`, reusing `value` when it already is one (decode path)."""
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ProtocolError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype != dtype:
        if np.dtype(dtype).kind == "u":
            if arr.size and arr.dtype.kind not in "ui":
                raise ProtocolError(f"{name} must hold integers, got {arr.dtype}")
            if arr.size and (int(arr.min()) < 0 or int(arr.max()) > np.iinfo(dtype).max):
                raise ProtocolError(f"{name} values must fit in {np.dtype(dtype).name}")
        elif arr.size and arr.dtype.kind not in "uif":
            raise ProtocolError(f"{name} must hold numbers, got {arr.dtype}")
        arr = arr.astype(dtype)
    elif arr.flags.writeable:
        arr = arr.copy()
    arr.flags.writeable = False
    return arr


def _same_float(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)


def _same(a: Any, b: Any) -> bool:
    """Field equality that treats NaN as equal to NaN (a decoded message equals its original)."""
    if isinstance(a, float) and isinstance(b, float):
        return _same_float(a, b)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    return a == b


class _WireEq:
    """Equality over all dataclass fields with `_same`; wire messages are not hashable."""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, kw_only=True, eq=False)
class PromptRef(_WireEq):
    """Which prompt a group answers. The receiver re-renders the prompt from its own copy of the set
    and compares `sha256` (lowercase hex of sha256 over the prompt text, UTF-8) before trusting it."""

    prompt_set_id: str
    index: int  # >= 0, position in the prompt set
    sha256: str  # 64 lowercase hex characters


@dataclass(frozen=True, kw_only=True, eq=False)
class SamplingParams(_WireEq):
    """How the completions were sampled; logprobs are under this (tempered, top-p) distribution.
    Receivers take top_p == 1 only and temperatures within their supported range (validate:
    `unsupported_top_p`, `unsupported_temperature`); a logprob check recomputes at `temperature`."""

    temperature: float  # > 0, finite
    top_p: float  # in (0, 1]
    max_new_tokens: int  # >= 1; no completion is longer


@dataclass(frozen=True, kw_only=True, eq=False)
class Completion:
    """One sampled completion.

    Invariants (checked by validate, not here): len(token_ids) == len(logprobs) >= 1; every token id
    < the vocabulary size; every logprob finite and <= 0; finish_reason in FINISH_REASONS.
    `claimed_reward` is the sender's own score, informational only: receivers recompute rewards.

    Cross-tokenizer exchange (version 2): `text` and `piece_bytes` are sent together or not at all.
    `text` is the completion as the sender's tokenizer decodes its tokens, without special tokens
    (eos etc.); `piece_bytes[t]` is how many bytes of text.encode("utf-8") token t produced, in
    order, 0 for special tokens, so that sum(piece_bytes) == len(text.encode("utf-8")) and
    len(piece_bytes) == len(token_ids). Not sent: text == "" and piece_bytes empty. A receiver
    with another tokenizer re-tokenizes `text` and aligns the two token streams on the byte
    boundaries the pieces mark (validate: `text_*` reasons). A decoded text that was not valid
    UTF-8 holds the bad bytes as lone surrogates (U+DC80-U+DCFF, Python's "surrogateescape"), so
    it can be represented and re-encoded byte for byte; validate rejects it.
    """

    token_ids: np.ndarray  # [T] uint32, read-only
    logprobs: np.ndarray  # [T] float32, read-only: log p_gen(sampled token) under the sampling distribution
    finish_reason: str  # 'stop' | 'length'
    claimed_reward: float
    text: str = ""  # the decoded completion without special tokens; "" when not sent
    piece_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint16))  # [T] uint16 or [0], read-only

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", _wire_array(self.token_ids, np.uint32, "token_ids"))
        object.__setattr__(self, "logprobs", _wire_array(self.logprobs, np.float32, "logprobs"))
        object.__setattr__(self, "piece_bytes", _wire_array(self.piece_bytes, np.uint16, "piece_bytes"))
        if not isinstance(self.text, str):
            raise ProtocolError(f"text must be a str, got {type(self.text).__name__}")

    @property
    def has_text(self) -> bool:
        """True when the sender sent text or pieces (validate checks they agree)."""
        return bool(self.text) or self.piece_bytes.shape[0] > 0

    def __eq__(self, other: object) -> bool:
        """Exact equality; logprobs compare bitwise so NaN payloads round-trip equal."""
        if not isinstance(other, Completion):
            return NotImplemented
        return (
            self.finish_reason == other.finish_reason
            and _same_float(self.claimed_reward, other.claimed_reward)
            and np.array_equal(self.token_ids, other.token_ids)
            and self.logprobs.tobytes() == other.logprobs.tobytes()
            and self.text == other.text
            and np.array_equal(self.piece_bytes, other.piece_bytes)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, kw_only=True, eq=False)
class RolloutGroup(_WireEq):
    """G completions of one prompt by one sender's model (vertical collaboration).

    Invariants (checked by validate): protocol_version supported; 1 <= len(completions) <= limit;
    per-token importance weights are only meaningful when `tokenizer_fingerprint` matches the
    receiver's (a receiver with another tokenizer needs the completions' text, which every
    completion of the group carries or none does). `created_at` is the DHT time (float seconds)
    the sender's step started, when it chose its prompts: the window of `created_at` binds `prompt`
    (the sender's slot k of that window; see swarm_node/swarm/binding.py and docs/architecture.md,
    "Prompt binding"), and the group is listed in the sender's index of that window. `policy_version` is the sender's step; it is
    informational and does not enter the prompt assignment.

    The declared model (`model_id`, `model_revision`, `adapter_digest`) names the exact weights
    that generated the group: an honest sender whose base weights were changed by training appends
    "+trained" to the base revision, and a LoRA sender declares the digest of its current adapter
    (`swarm_node.policy.models.Policy`). A receiver holding those weights may recompute some
    logprobs (`swarm_node.peers.spotcheck`); validate checks the digest's form (`bad_adapter_digest`).
    """

    protocol_version: int = EXCHANGE_VERSION
    swarm_id: str
    sender: str  # peer id (base58 string)
    model_id: str
    model_revision: str  # the base revision, with "+trained" appended once the sender's base weights moved
    tokenizer_fingerprint: str
    policy_version: int  # >= 0
    adapter_digest: str = ""  # version 2: sha256 hex of the sender's current LoRA adapter weights; "" without one
    created_at: float
    prompt: PromptRef
    sampling: SamplingParams
    completions: tuple[Completion, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "completions", _as_tuple(self.completions, "completions"))

    @property
    def num_tokens(self) -> int:
        return sum(int(c.token_ids.shape[0]) for c in self.completions)


@dataclass(frozen=True, kw_only=True, eq=False)
class IndexEntry(_WireEq):
    """Where one encoded RolloutGroup lives: the concatenation of the content-addressed chunks
    `chunk_digests` (sha256 hex, in order) is the encoding, `size` bytes long.

    Version 4: the entry also declares its group, so a receiver decides before downloading whether
    it can use it: the group's `tokenizer_fingerprint`, whether every completion carries text
    (`has_text`) and its G (`group_size`). An entry whose fingerprint is "" declares nothing (every
    entry of versions 1-3): it is fetched and judged as before. A declaration the fetched group
    contradicts is an `index_mismatch`, a fault of the sender."""

    chunk_digests: tuple[str, ...]  # >= 1 digests of 64 lowercase hex characters
    size: int  # total bytes of the encoded group
    prompt_index: int
    policy_version: int
    created_at: float
    tokenizer_fingerprint: str = ""  # version 4: the group's; "" = not declared
    has_text: bool = False  # version 4: every completion of the group carries its text
    group_size: int = 0  # version 4: the group's number of completions; 0 = not declared

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunk_digests", _as_tuple(self.chunk_digests, "chunk_digests"))
        if not isinstance(self.has_text, bool):
            raise ProtocolError(f"has_text must be a bool, got {type(self.has_text).__name__}")

    @property
    def declared(self) -> bool:
        """Whether the entry declares its group (version 4, a fingerprint given)."""
        return bool(self.tokenizer_fingerprint)


@dataclass(frozen=True, kw_only=True, eq=False)
class RolloutIndex(_WireEq):
    """The small record a peer publishes under the per-window key (its own subkey)."""

    protocol_version: int = INDEX_VERSION
    sender: str
    window: int  # keys.window_of(created_at, window_seconds)
    entries: tuple[IndexEntry, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", _as_tuple(self.entries, "entries"))


MAX_RECEIPTS = 32
"""Receipts one status record carries at most (senders; the node keeps the ones that gave it the
most, `swarm_node.peers.receipts`). With every other field at its bound, a record stays under the DHT's
64 KiB owned-record limit (tests/unit/test_receipts_protocol.py states both sizes)."""
MAX_RECEIPT_REASONS = 8
"""Drop reasons one receipt names at most; the node sums the rest under `OTHER_REASON`."""
MAX_RECEIPT_REASON_LEN = 40
"""Characters of a drop reason at most (lowercase letters, digits and `_`: validate)."""
MAX_RECEIPT_COUNT = 1 << 32
"""Largest count a receipt may state (validate): far above any span's groups or samples."""
MAX_RECEIPTS_SPAN_S = 7 * 86400.0
"""Longest span a record's receipts may cover (validate)."""
OTHER_REASON = "other"


@dataclass(frozen=True, kw_only=True, eq=False)
class Receipt(_WireEq):
    """What a receiver did with one sender's groups over its record's receipts span (version 3): its
    signed statement, since the receiver's status record is signed by the receiver's key.

    Invariants (checked by validate): every count an int in [0, MAX_RECEIPT_COUNT];
    gradient + filtered <= samples (a filtered sample carries no gradient);
    filtered_advantage <= filtered and filtered_kl <= filtered (a filtered sample met the advantage
    condition, A <= 0, or the KL condition, KL > g, or both: it may count in both);
    at most MAX_RECEIPT_REASONS `dropped` pairs of (reason, groups > 0), reasons distinct, each of
    [a-z0-9_] and at most MAX_RECEIPT_REASON_LEN characters; `sender` a non-empty peer id.
    """

    sender: str  # peer id of the node whose groups these are
    taken: int  # groups that became training samples
    samples: int  # of its samples trained on (filtered ones included)
    gradient: int  # samples that carried gradient (not filtered, nonzero advantage)
    filtered: int  # samples the filter rule dropped
    filtered_advantage: int  # of those, samples with a non-positive advantage
    filtered_kl: int  # of those, samples whose KL exceeded the receiver's g
    dropped: tuple[tuple[str, int], ...] = ()  # (reason, groups or index records dropped), most first

    def __post_init__(self) -> None:
        object.__setattr__(self, "dropped", tuple(_as_tuple(d, "dropped reason") for d in _as_tuple(self.dropped, "dropped")))


@dataclass(frozen=True, kw_only=True, eq=False)
class NodeStatus(_WireEq):
    """What observers read about a node. `metrics` holds finite floats under short keys (bounded
    count and key length, checked by validate); treat it as read-only. `tokenizer_fingerprint`
    (version 2) is the node's tokenizer's, "" for observers and version-1 records: peers count the
    tokenizers of a swarm from it (swarm.send_text = "auto").

    `receipts` (version 3): for at most MAX_RECEIPTS senders whose groups this node judged, what it
    did with them over the `receipts_span_s` seconds before `timestamp` (0 with no receipts;
    validate: finite, within [0, MAX_RECEIPTS_SPAN_S]); senders distinct. Records of versions 1 and
    2 decode with none."""

    protocol_version: int = STATUS_VERSION
    peer_id: str
    role: str  # 'trainer' | 'observer'
    model_id: str
    step: int  # >= 0
    timestamp: float  # DHT time
    maddrs: tuple[str, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)
    tokenizer_fingerprint: str = ""
    receipts_span_s: float = 0.0
    receipts: tuple[Receipt, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "maddrs", _as_tuple(self.maddrs, "maddrs"))
        object.__setattr__(self, "receipts", _as_tuple(self.receipts, "receipts"))
        if not isinstance(self.metrics, dict):
            raise ProtocolError("metrics must be a dict")
        object.__setattr__(self, "metrics", dict(sorted(self.metrics.items())))


@dataclass(frozen=True, kw_only=True, eq=False)
class PromptSetManifest(_WireEq):
    """A seeded prompt set: the operator signs `codec.manifest_signing_bytes(manifest)` (the
    encoding with an empty signature) with the key whose public part is `owner_public_key`."""

    protocol_version: int = EXCHANGE_VERSION
    prompt_set_id: str
    name: str
    answer_kind: str  # 'number' | 'math'
    num_problems: int  # >= 1; indices 0..num_problems-1 spread over the chunks in order
    chunk_digests: tuple[str, ...]  # sha256 hex of each encoded PromptChunk
    owner_public_key: bytes
    created_at: float
    signature: bytes = b""

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunk_digests", _as_tuple(self.chunk_digests, "chunk_digests"))


@dataclass(frozen=True, kw_only=True, eq=False)
class PromptSetTombstone(_WireEq):
    """The end of a seeded prompt set: the operator signs `codec.tombstone_signing_bytes(tombstone)`
    with the key of the set's manifests (`owner_public_key`). It ends the manifests of
    `prompt_set_id` signed by that key with `created_at <= ended_at` (DHT time): nodes stop
    re-storing them and refuse to load the set; a manifest signed later starts it again.
    `successor`: the id of the set that replaces it ("" for none), shown to operators."""

    protocol_version: int = EXCHANGE_VERSION
    prompt_set_id: str
    owner_public_key: bytes
    ended_at: float
    successor: str = ""
    signature: bytes = b""


@dataclass(frozen=True, kw_only=True, eq=False)
class PromptChunk(_WireEq):
    """A content-addressed slice of a prompt set: (index, question, answer) triples."""

    protocol_version: int = EXCHANGE_VERSION
    items: tuple[tuple[int, str, str], ...]

    def __post_init__(self) -> None:
        items = _as_tuple(self.items, "items")
        object.__setattr__(self, "items", tuple(_as_tuple(it, "item") for it in items))


Message = RolloutGroup | RolloutIndex | NodeStatus | PromptSetManifest | PromptChunk | PromptSetTombstone
