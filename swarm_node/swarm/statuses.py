"""Status records: each node's `NodeStatus` under its shard of the swarm's status keys, read and checked.

A node stores its record in its own subkey of its own shard (`keys.status_key(swarm_id,
keys.status_shard(peer_id))`); a read asks for every shard (`keys.status_keys`) in one concurrent
batch under one deadline and merges them. A record under a shard its owner does not belong in is
dropped and counted as `status_wrong_shard` (replicas refuse such stores too: `validators.py`), so
identities cannot pile into one shard unless ground for it, and a shard filled that way keeps out
only newcomers of that shard (storage.py keeps each shard's records against newcomers).

A record that does not decode, is not a `NodeStatus`, is signed by another peer than it names,
breaks `protocol.validate` limits, or whose receipts claim more than a node could have done
(`protocol.receipt_rules.claim_reasons`) is dropped and counted as `status_<reason>`.

A node keeps the records of the peers whose groups it took (`StatusKeeper`, used by the peer
ledger for the receipts naming the node): a peer that did work this node checked is no free
identity, and its record stays in the node's view until it lapses, even when a read misses it (a
replica lost it, a read timed out, a flood kept it out of the key). Records of peers it never took
from are only what the read returns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from protocol import codec, keys
from protocol.messages import SUPPORTED_VERSIONS, NodeStatus, ProtocolError
from protocol.receipt_rules import claim_reasons
from protocol.validate import ValidationLimits, validate_status
from swarm_node.swarm.transport import DropCounter, Transport

DECODE_ERROR = "decode_error"
BAD_VERSION = "bad_version"
WRONG_TYPE = "wrong_type"
SENDER_MISMATCH = "sender_mismatch"
WRONG_SHARD = "wrong_shard"


def decode_reason(data: bytes) -> str:
    """Why `data` failed to decode: `bad_version` for a well-framed message of another version."""
    if len(data) >= 3 and data[:2] == codec.MAGIC and data[2] not in SUPPORTED_VERSIONS:
        return BAD_VERSION
    return DECODE_ERROR


class StatusKeeper:
    """The newest valid record of each peer this node took groups from (`took_from()`: their peer
    ids, from the node's ledger), kept until it lapses (its expiration as `merge` is told); at most
    `max_kept` records, those lapsing last. Not thread-safe: its owner serialises `merge`."""

    def __init__(self, took_from: Callable[[], Collection[str]], max_kept: int = 256) -> None:
        self.took_from = took_from
        self.max_kept = max_kept
        self.kept_last = 0  # records the last merge added that its read did not return
        self._kept: dict[str, tuple[NodeStatus, float]] = {}  # peer -> (record, its expiration)

    def merge(self, read: dict[str, tuple[NodeStatus, float]], now: float) -> list[NodeStatus]:
        """The records of `read` (peer -> (valid record, expiration)) and the kept records of peers
        it lacks, newest of each peer; remembers the read's records of peers this node took from."""
        trusted = set(self.took_from())
        for peer, (status, expiration) in read.items():
            kept = self._kept.get(peer)
            if peer in trusted and (kept is None or status.timestamp >= kept[0].timestamp):
                self._kept[peer] = (status, expiration)
        live = sorted(((p, v) for p, v in self._kept.items() if p in trusted and v[1] > now),
                      key=lambda pv: pv[1][1], reverse=True)
        self._kept = dict(live[: self.max_kept])
        out = {peer: status for peer, (status, _) in read.items()}
        self.kept_last = 0
        for peer, (status, _) in self._kept.items():
            if peer not in out or status.timestamp > out[peer].timestamp:
                self.kept_last += peer not in out
                out[peer] = status
        return sorted(out.values(), key=lambda s: s.peer_id)


def read_statuses(transport: Transport, swarm_id: str, limits: ValidationLimits, drops: DropCounter,
                  timeout: float) -> list[NodeStatus]:
    """Valid status records of live peers (including this node's), sorted by peer id: every status
    shard, read concurrently within `timeout`."""
    out = []
    found = transport.get_all_many(keys.status_keys(swarm_id), timeout)
    for shard, key in enumerate(keys.status_keys(swarm_id)):
        for owner, item in found.get(key, {}).items():
            try:
                status = codec.decode(item.value)
            except ProtocolError:
                drops.add("status_" + decode_reason(item.value))
                continue
            reason = None
            if not isinstance(status, NodeStatus):
                reason = WRONG_TYPE
            elif status.peer_id != owner:
                reason = SENDER_MISMATCH
            elif keys.status_shard(owner) != shard:
                reason = WRONG_SHARD
            else:
                reasons = validate_status(status, limits) or claim_reasons(status)
                reason = reasons[0] if reasons else None
            if reason is None:
                out.append(status)
            else:
                drops.add("status_" + reason)
    return sorted(out, key=lambda s: s.peer_id)
