"""Seeded prompt sets: an operator publishes a prompt set once; nodes load and verify it.

Layout: the problems travel as content-addressed `PromptChunk` blobs (each well under the blob
limit); a `PromptSetManifest` lists the chunk digests and is signed by the operator's RSA key
(`codec.manifest_signing_bytes`, hivemind's RSA-PSS signature). The manifest is stored under
`keys.prompt_manifest_key(swarm_id, prompt_set_id)` in the seeding node's own subkey; the trust
anchor is the signature inside the manifest, so any node may store (and re-seed) it.

A prompt set's id is `swarm_node.tasks.base.content_id(task, problems)` (`<task>-<sha256 prefix>`
over every question and answer), so a loaded set is checked three ways: the manifest signature
against the configured operator key, every chunk against its digest, and the problems against
the id. Without a configured key only the last two hold (the id is self-certifying), and the
load logs that the set is unsigned-by-choice.

An operator ends a set with a signed tombstone under the same key (`end_prompt_set`), optionally
naming its successor. `load_followed` follows successors when the operator key is configured: the
end of a set, signed by that key, leads to the set it names, verified against the same key, up to
`MAX_SUCCESSOR_HOPS` ends in a row; a loop, a longer chain or an end without successor is final
(`PromptSetEnded`). Without a configured key nothing is followed: any key can sign a manifest of a
public set and end it, so only the operator's key may redirect a node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from hivemind.utils.crypto import RSAPublicKey

from protocol import codec, keys
from protocol.messages import PromptChunk, PromptSetManifest, PromptSetTombstone, ProtocolError
from protocol.validate import ValidationLimits, validate_manifest, validate_tombstone
from swarm_node.swarm.identity import NodeIdentity
from swarm_node.swarm.transport import OwnedValue, Transport
from swarm_node.tasks.base import Problem, PromptSet, content_id

log = logging.getLogger(__name__)

MAX_CHUNK_BYTES = 256 << 10  # encoded PromptChunk target; the blob limit is 1 MiB
MAX_ITEMS_PER_CHUNK = 1024
MAX_SUCCESSOR_HOPS = 8  # ended sets `load_followed` follows in a row before it gives up


class PromptSetError(RuntimeError):
    """A prompt set could not be loaded: not found in time, or no copy passed verification."""


class PromptSetEnded(PromptSetError):
    """The set's operator ended it (a verified tombstone: `tombstone.successor` names its replacement,
    "" for none), or its successors lead nowhere a node can follow (a loop, too long a chain)."""

    def __init__(self, message: str, tombstone: PromptSetTombstone) -> None:
        super().__init__(message)
        self.tombstone = tombstone


def _chunk_problems(problems: tuple[Problem, ...]) -> list[bytes]:
    """Encoded PromptChunks, each at most MAX_CHUNK_BYTES (a single huge problem gets its own chunk)."""
    chunks, items, size = [], [], 0
    for p in problems:
        item = (p.index, p.question, p.answer)
        item_size = len(p.question.encode()) + len(p.answer.encode()) + 16
        if items and (size + item_size > MAX_CHUNK_BYTES or len(items) >= MAX_ITEMS_PER_CHUNK):
            chunks.append(codec.encode(PromptChunk(items=tuple(items))))
            items, size = [], 0
        items.append(item)
        size += item_size
    if items:
        chunks.append(codec.encode(PromptChunk(items=tuple(items))))
    return chunks


def seed_prompt_set(
    transport: Transport,
    swarm_id: str,
    prompt_set: PromptSet,
    name: str,
    operator: NodeIdentity,
    *,
    ttl_s: float = 3600.0,
    timeout: float = 30.0,
) -> PromptSetManifest:
    """Publish `prompt_set` (chunks + a manifest signed by `operator`); returns the manifest.

    Call again before `ttl_s` elapses to keep the set available (re-seeding stores the same
    chunks, so only the expiration moves).
    """
    if [p.index for p in prompt_set.problems] != list(range(len(prompt_set))):
        raise ValueError("prompt set problems must be indexed 0..n-1 in order")
    now = transport.dht_time()
    chunks = _chunk_problems(prompt_set.problems)
    digests = transport.put_blobs(chunks, now + ttl_s, timeout)
    manifest = PromptSetManifest(
        prompt_set_id=keys.check_name(prompt_set.id, "prompt set id"), name=name,
        answer_kind=prompt_set.answer_kind, num_problems=len(prompt_set), chunk_digests=tuple(digests),
        owner_public_key=operator.public_key, created_at=now,
    )
    signature = operator.private_key.sign(codec.manifest_signing_bytes(manifest))
    manifest = replace(manifest, signature=signature)
    key = keys.prompt_manifest_key(swarm_id, prompt_set.id)
    if not transport.store_owned(key, codec.encode(manifest), now + ttl_s, timeout):
        raise PromptSetError(f"no peer accepted the manifest of {prompt_set.id} within {timeout:.0f}s")
    return manifest


def _verify(public_key_bytes: bytes, data: bytes, signature: bytes) -> bool:
    try:
        public_key = RSAPublicKey.from_bytes(public_key_bytes)
    except (ValueError, TypeError, IndexError):
        return False
    return public_key.verify(data, signature)


def verify_manifest_signature(manifest: PromptSetManifest) -> bool:
    """True if `manifest.signature` is the owner key's signature over the canonical manifest bytes."""
    return _verify(manifest.owner_public_key, codec.manifest_signing_bytes(manifest), manifest.signature)


def verify_tombstone_signature(tombstone: PromptSetTombstone) -> bool:
    """True if `tombstone.signature` is the owner key's signature over the canonical tombstone bytes."""
    return _verify(tombstone.owner_public_key, codec.tombstone_signing_bytes(tombstone), tombstone.signature)


def end_prompt_set(
    transport: Transport,
    swarm_id: str,
    prompt_set_id: str,
    operator: NodeIdentity,
    *,
    successor: str = "",
    ttl_s: float = 3600.0,
    timeout: float = 30.0,
) -> PromptSetTombstone:
    """Store a tombstone signed by `operator` under the set's manifest key; returns it.

    `ttl_s` should be the swarm's `max_record_ttl_s`: no copy of a manifest stored before the
    tombstone outlives it, so every node that reads the key before its copy lapses sees the end.
    """
    keys.check_name(prompt_set_id, "prompt set id")
    if successor:
        keys.check_name(successor, "successor prompt set id")
    now = transport.dht_time()
    tombstone = PromptSetTombstone(prompt_set_id=prompt_set_id, owner_public_key=operator.public_key,
                                   ended_at=now, successor=successor)
    tombstone = replace(tombstone, signature=operator.private_key.sign(codec.tombstone_signing_bytes(tombstone)))
    if not transport.store_owned(keys.prompt_manifest_key(swarm_id, prompt_set_id), codec.encode(tombstone),
                                 now + ttl_s, timeout):
        raise PromptSetError(f"no peer accepted the tombstone of {prompt_set_id} within {timeout:.0f}s")
    return tombstone


@dataclass
class VerifiedRecord:
    """One writer's verified record under a manifest key: the exact bytes, as stored."""

    writer: str
    item: OwnedValue
    message: PromptSetManifest | PromptSetTombstone


@dataclass
class PromptSetRecords:
    """What one read of a set's manifest key holds (see `read_records`)."""

    manifests: list[VerifiedRecord] = field(default_factory=list)  # newest expiration first
    tombstones: list[VerifiedRecord] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # writer -> reason

    def tombstone_for(self, owner_public_key: bytes, created_at: float = float("-inf")) -> PromptSetTombstone | None:
        """The verified tombstone that ends a manifest signed by `owner_public_key` and created at
        `created_at` (DHT time): same key, ended at or after it. A manifest the operator signs after
        the tombstone (the set seeded again) is not ended by it, so a replayed old tombstone cannot
        end a set for good. Without `created_at`: any tombstone of that key."""
        for record in self.tombstones:
            message = record.message
            if message.owner_public_key == owner_public_key and message.ended_at >= created_at:  # type: ignore[union-attr]
                return message  # type: ignore[return-value]
        return None

    def ends(self, manifest: PromptSetManifest) -> PromptSetTombstone | None:
        """The verified tombstone that ends `manifest`, if any."""
        return self.tombstone_for(manifest.owner_public_key, manifest.created_at)

    def live_manifests(self) -> list[VerifiedRecord]:
        """Verified manifests no verified tombstone ends, newest expiration first."""
        return [r for r in self.manifests if self.ends(r.message) is None]


def ended_since(transport: Transport, swarm_id: str, prompt_set_id: str, owner: bytes, since: float,
                timeout: float = 10.0) -> PromptSetTombstone | None:
    """The operator `owner`'s tombstone of the set, ended at or after `since` (a seeder's first
    manifest), when one is readable now; None otherwise."""
    entries = transport.get_all(keys.prompt_manifest_key(swarm_id, prompt_set_id), timeout)
    return read_records(entries, prompt_set_id, owner).tombstone_for(owner, since)


def read_records(entries: dict[str, OwnedValue], prompt_set_id: str, owner: bytes | None) -> PromptSetRecords:
    """Sort the entries of a manifest key (`{writer: OwnedValue}`) into verified manifests, verified
    tombstones (signature checked, the expected `owner` when given) and a reason for every other."""
    out = PromptSetRecords()
    for writer, item in sorted(entries.items(), key=lambda kv: -kv[1].expiration_time):
        reason, message = _record_reason(item.value, prompt_set_id, owner)
        if message is None:
            out.rejected[writer] = reason or "rejected"
        elif isinstance(message, PromptSetTombstone):
            out.tombstones.append(VerifiedRecord(writer, item, message))
        else:
            out.manifests.append(VerifiedRecord(writer, item, message))
    return out


def _record_reason(data: bytes, prompt_set_id: str, owner: bytes | None
                   ) -> tuple[str | None, PromptSetManifest | PromptSetTombstone | None]:
    try:
        message = codec.decode(data)
    except ProtocolError:
        return "decode_error", None
    limits = ValidationLimits(vocab_size=1, expected_owner=owner)
    if isinstance(message, PromptSetTombstone):
        reasons = validate_tombstone(message, limits)
        if reasons:
            return "tombstone_" + reasons[0], None
        if message.prompt_set_id != prompt_set_id:
            return "tombstone_wrong_prompt_set", None
        if not verify_tombstone_signature(message):
            return "tombstone_bad_signature", None
        return None, message
    if not isinstance(message, PromptSetManifest):
        return "wrong_type", None
    reasons = validate_manifest(message, limits)
    if reasons:
        return reasons[0], None
    if message.prompt_set_id != prompt_set_id:
        return "wrong_prompt_set", None
    if not verify_manifest_signature(message):
        return "bad_signature", None
    return None, message


def ended_message(prompt_set_id: str, tombstone: PromptSetTombstone) -> str:
    """One line saying that the operator ended a set, and what to use instead."""
    if tombstone.successor:
        return (f"prompt set {prompt_set_id} was ended by its operator: use its successor "
                f"(--set swarm.prompt_set_id={tombstone.successor})")
    return f"prompt set {prompt_set_id} was ended by its operator: ask the operator which prompt set to use"


def _assemble(manifest: PromptSetManifest, chunks: list[bytes]) -> tuple[str | None, PromptSet | None]:
    problems: list[Problem] = []
    for data in chunks:
        try:
            chunk = codec.decode(data)
        except ProtocolError:
            return "decode_error", None
        if not isinstance(chunk, PromptChunk):
            return "wrong_type", None
        for item in chunk.items:
            if len(item) != 3 or not isinstance(item[0], int) or not all(isinstance(x, str) for x in item[1:]):
                return "bad_item", None
            if item[0] != len(problems):
                return "bad_index", None
            problems.append(Problem(index=item[0], question=item[1], answer=item[2]))
    if len(problems) != manifest.num_problems:
        return "wrong_count", None
    task = manifest.prompt_set_id.rsplit("-", 1)[0]
    if content_id(task, problems) != manifest.prompt_set_id:
        return "content_mismatch", None
    return None, PromptSet(id=manifest.prompt_set_id, answer_kind=manifest.answer_kind, problems=tuple(problems))


def load_prompt_set(
    transport: Transport,
    swarm_id: str,
    prompt_set_id: str,
    owner_public_key: str | bytes | None,
    *,
    timeout: float = 30.0,
) -> PromptSet:
    """Fetch, verify and return a seeded prompt set. Raises PromptSetError with every rejection reason."""
    owner = owner_public_key.encode() if isinstance(owner_public_key, str) else owner_public_key
    if owner is None:
        log.warning("loading prompt set %s without an operator key: only its content hash is checked",
                    prompt_set_id)
    entries = transport.get_all(keys.prompt_manifest_key(swarm_id, prompt_set_id), timeout)
    if not entries:
        raise PromptSetError(f"prompt set {prompt_set_id} not found in swarm {swarm_id!r} within {timeout:.0f}s")
    records = read_records(entries, prompt_set_id, owner)
    rejected = [f"{writer}: {reason}" for writer, reason in records.rejected.items()]
    for record in records.manifests:
        manifest = record.message
        if records.ends(manifest) is not None:
            rejected.append(f"{record.writer}: ended")
            continue
        fetched = transport.get_blobs(list(manifest.chunk_digests), timeout)
        if fetched.failed:
            reason = "chunk_" + next(iter(fetched.failed.values()))
        else:
            reason, prompt_set = _assemble(manifest, [fetched.found[d] for d in manifest.chunk_digests])
            if prompt_set is not None:
                return prompt_set
        rejected.append(f"{record.writer}: {reason}")
    ended = [records.ends(r.message) for r in records.manifests]
    if owner is not None and not records.manifests:
        ended.append(records.tombstone_for(owner))
    if not records.live_manifests() and any(ended):
        tombstone = next(t for t in ended if t is not None)
        raise PromptSetEnded(ended_message(prompt_set_id, tombstone), tombstone)
    raise PromptSetError(f"no valid copy of prompt set {prompt_set_id}: {'; '.join(rejected)}")


def valid_successor(tombstone: PromptSetTombstone) -> bool:
    """Whether the tombstone names a successor that is a valid prompt set id (validate checks no more
    than its signature and owner)."""
    try:
        keys.check_name(tombstone.successor, "successor prompt set id")
    except ProtocolError:
        return False
    return True


@dataclass(frozen=True)
class FollowedSet:
    """What `load_followed` found: the set to train on, and the ended sets followed to reach it
    (in order, the one asked for first; empty when that one is live)."""

    prompt_set: PromptSet
    ended: tuple[str, ...] = ()

    def message(self) -> str:
        """One line: which ended set this follows (empty when nothing was followed)."""
        if not self.ended:
            return ""
        chain = " -> ".join((*self.ended, self.prompt_set.id))
        return (f"prompt set {self.ended[0]} was ended by its operator: following its successor "
                f"{self.prompt_set.id}" + (f" ({chain})" if len(self.ended) > 1 else ""))


def load_followed(
    transport: Transport,
    swarm_id: str,
    prompt_set_id: str,
    owner_public_key: str | bytes | None,
    *,
    timeout: float = 30.0,
    ended: tuple[str, ...] = (),
    max_hops: int = MAX_SUCCESSOR_HOPS,
) -> FollowedSet:
    """`load_prompt_set`, following the successors of ended sets when `owner_public_key` is given
    (the tombstone, and the successor's manifest, must be that key's). `ended`: sets already
    followed to reach `prompt_set_id` (a node that saw its set's tombstone itself). Raises
    PromptSetEnded for an end without successor, without a key, in a loop or past `max_hops` ends;
    PromptSetError (naming the ended sets) when a successor is not found or no copy of it verifies."""
    path = list(ended)
    current = prompt_set_id
    while True:
        try:
            return FollowedSet(load_prompt_set(transport, swarm_id, current, owner_public_key, timeout=timeout),
                               tuple(path))
        except PromptSetEnded as e:
            successor = e.tombstone.successor
            if path and not successor:
                raise PromptSetEnded(f"{e} (followed from {' -> '.join(path)})", e.tombstone) from None
            if owner_public_key is None or not successor:
                raise
            path.append(current)
            chain = " -> ".join((*path, successor))
            if not valid_successor(e.tombstone):
                raise PromptSetEnded(f"prompt set {path[0]} was ended by its operator, naming no valid successor "
                                     f"({chain}): ask the operator which prompt set to use", e.tombstone) from None
            if successor in path:
                raise PromptSetEnded(f"prompt set {path[0]} was ended by its operator, and its successors loop "
                                     f"({chain}): ask the operator which prompt set to use", e.tombstone) from None
            if len(path) > max_hops:
                raise PromptSetEnded(f"prompt set {path[0]} was ended by its operator, and its successors were "
                                     f"ended more than {max_hops} times in a row ({chain}): ask the operator "
                                     "which prompt set to use", e.tombstone) from None
            current = successor
        except PromptSetError as e:  # not found, or no copy verified
            if not path:
                raise
            raise PromptSetError(f"{e} (the successor of ended prompt set {' -> '.join(path)})") from e
