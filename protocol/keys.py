"""The only place DHT key strings are built.

Layout (all under the swarm's namespace, so swarms sharing a DHT never collide):

    swarm-node/<swarm_id>/rollouts/<window>          per-window rollout index, level 0 (one shard);
                                                     one subkey per peer
    swarm-node/<swarm_id>/rollouts/<window>/<L>.<s>  shard s of level L (1 <= L <= MAX_SHARD_LEVEL,
                                                     0 <= s < 2**L): peers with index_shard(peer, L) == s
    swarm-node/<swarm_id>/chunk/<sha256 hex>         content-addressed payload chunk
    swarm-node/<swarm_id>/status/<s>                 shard s of the node status records (0 <= s < STATUS_SHARDS):
                                                     one subkey per peer with status_shard(peer) == s
    swarm-node/<swarm_id>/prompts/<prompt_set_id>    signed prompt-set manifest

Status shards: a replica keeps at most 256 KiB under one key (swarm.max_bytes_per_key), about 63
status records of 4.1 KB (32 receipts each); with every record under one key, `status`, the
tokenizer census and receipts saw at most ~63 nodes, and every store heard the whole key back.
STATUS_SHARDS = 16 keys hold ~1,000 such records (16 x 63), a store hears 1/16 of the records, and
a read is 16 concurrent lookups in one batch. The unsharded key of earlier releases
(`swarm-node/<swarm_id>/status`) is no longer written nor read, and replicas refuse it (it left the
owned-key schedule). PROTOCOL_VERSION is unchanged: the version byte describes a message's
encoding, and no message changed; a node of an earlier release stores its status where this one
does not read (and replicas of either refuse the other's status key as off-schedule), so a mixed
swarm sees its status records split by release while groups and indexes flow as before: upgrade a
swarm together.

Every function validates its inputs and raises ProtocolError on bad ones, so that a key built from
peer-supplied data (a digest from an index record) can never escape its namespace.
"""

from __future__ import annotations

import hashlib
import math
import re

from protocol.messages import ProtocolError

PREFIX = "swarm-node"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
MAX_WINDOW = 2**62
MAX_SHARD_LEVEL = 10  # at most 2**10 = 1,024 index shards per window


def check_name(value: object, what: str = "swarm id") -> str:
    """A swarm or prompt-set id: 1-64 characters of [A-Za-z0-9._-], starting alphanumeric."""
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise ProtocolError(f"bad {what} {value!r}: use 1-64 characters of [A-Za-z0-9._-], starting alphanumeric")
    return value


def check_digest(value: object) -> str:
    """A content digest: 64 lowercase hex characters (sha256)."""
    if not isinstance(value, str) or _DIGEST.fullmatch(value) is None:
        raise ProtocolError(f"bad chunk digest {value!r}: expected 64 lowercase hex characters")
    return value


def rollout_index_key(swarm_id: str, window: int, level: int = 0, shard: int = 0) -> str:
    """Key of one shard of the rollout index of a time window (each peer writes its own subkey).

    Level `level` splits a window's index into 2**level shards; level 0 is the whole window under
    one key. A peer writes under shard `index_shard(peer_id, level)` of the level it uses.
    """
    if not isinstance(window, int) or isinstance(window, bool) or not 0 <= window <= MAX_WINDOW:
        raise ProtocolError(f"bad window {window!r}: expected an int in [0, {MAX_WINDOW}]")
    _check_shard(level, shard)
    base = f"{PREFIX}/{check_name(swarm_id)}/rollouts/{window}"
    return base if level == 0 else f"{base}/{level}.{shard}"


def _check_shard(level: object, shard: object) -> None:
    if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= MAX_SHARD_LEVEL:
        raise ProtocolError(f"bad index level {level!r}: expected an int in [0, {MAX_SHARD_LEVEL}]")
    if not isinstance(shard, int) or isinstance(shard, bool) or not 0 <= shard < 2**level:
        raise ProtocolError(f"bad index shard {shard!r} of level {level}: expected an int in [0, {2**level})")


def index_shard(peer_id: str, level: int) -> int:
    """The shard of level `level` a peer's index records belong in: the low `level` bits of
    sha256(peer id), so a shard of level L+1 is half of a shard of level L."""
    _check_shard(level, 0)
    if not isinstance(peer_id, str):
        raise ProtocolError(f"bad peer id {peer_id!r}")
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[-4:], "big") % (1 << level)


def window_index_keys(swarm_id: str, window: int, max_level: int = MAX_SHARD_LEVEL) -> list[str]:
    """Every index key of one window: all shards of levels 0..max_level (2**(max_level+1) - 1 keys)."""
    return [rollout_index_key(swarm_id, window, level, shard)
            for level in range(max_level + 1) for shard in range(2**level)]


def chunk_key(swarm_id: str, digest_hex: str) -> str:
    """Key of a content-addressed chunk (the value's sha256 must equal `digest_hex`)."""
    return f"{PREFIX}/{check_name(swarm_id)}/chunk/{check_digest(digest_hex)}"


STATUS_SHARDS = 16  # a power of two: status_shard takes the low bits of the peer id's hash


def status_shard(peer_id: str) -> int:
    """The status shard a peer's status record belongs in: the low log2(STATUS_SHARDS) bits of
    sha256(peer id) (`index_shard` at that level)."""
    return index_shard(peer_id, STATUS_SHARDS.bit_length() - 1)


def status_key(swarm_id: str, shard: int) -> str:
    """Key of shard `shard` of the swarm's node status records (each peer writes its own subkey of
    its own shard, `status_shard(peer_id)`)."""
    if not isinstance(shard, int) or isinstance(shard, bool) or not 0 <= shard < STATUS_SHARDS:
        raise ProtocolError(f"bad status shard {shard!r}: expected an int in [0, {STATUS_SHARDS})")
    return f"{PREFIX}/{check_name(swarm_id)}/status/{shard}"


def status_keys(swarm_id: str) -> list[str]:
    """Every status shard key of a swarm, in shard order (what a reader of all records reads)."""
    return [status_key(swarm_id, shard) for shard in range(STATUS_SHARDS)]


def prompt_manifest_key(swarm_id: str, prompt_set_id: str) -> str:
    """Key of a prompt set's signed manifest."""
    return f"{PREFIX}/{check_name(swarm_id)}/prompts/{check_name(prompt_set_id, 'prompt set id')}"


def window_of(dht_time: float, window_seconds: float) -> int:
    """The index window containing `dht_time`: floor(dht_time / window_seconds)."""
    try:
        t, w = float(dht_time), float(window_seconds)
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"bad time or window length: {e}") from e
    if not (math.isfinite(t) and t >= 0 and math.isfinite(w) and w > 0):
        raise ProtocolError(f"bad time {dht_time!r} or window length {window_seconds!r}")
    ratio = t / w
    if not ratio <= MAX_WINDOW:
        raise ProtocolError(f"window of time {dht_time!r} / {window_seconds!r} out of range")
    window = math.floor(ratio)
    if window > MAX_WINDOW:
        raise ProtocolError(f"window {window} out of range")
    return window
