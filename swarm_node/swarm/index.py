"""The sharded rollout index: which index keys a node writes and which it reads per gather.

Without sharding, every gather reads the one index key of each window, which holds every peer's
record: a node's read cost grows with the swarm, and the few DHT nodes that store the key serve
every reader (load quadratic in the swarm). Here a window's index is split into shards:

* **Levels.** Level L splits a window into 2**L shards (`keys.rollout_index_key(swarm, window,
  L, shard)`; level 0 is the old single key). A peer of level L writes its record of a window
  under shard `keys.index_shard(peer_id, L)`; the level it used for a window is kept for that
  window's republishes.
* **The level follows the swarm size.** Each node estimates how many peers publish per window
  from the shards it reads, and uses the smallest level whose shards hold at most
  `peers_per_shard` peers. It moves up when its shards would hold more than that and down when
  they would hold less than a quarter of it (hysteresis: no flapping at a boundary). Nodes that
  see the same swarm pick the same level; a node one level off is still read (the probes below).
* **Reading** (per gather, whatever the swarm size): `shards_per_read` random shards of the
  node's level in each window read, plus one random shard of one neighbouring level in the
  `probe_windows` newest windows: L+1 when the estimate is above half the level's top (nodes
  with a slightly higher estimate may have moved up), else L-1. A node without an estimate (just started, or having
  found nobody for `rediscover_every` gathers) also reads one shard of every level of the newest
  window (discovery), so a node joining a large swarm finds its level in one gather.
* **The estimate.** A shard of level l read with n owners in it stands for n * 2**l peers of that
  level (the caller counts an owner only when its record lists an entry that passes the checks
  made before fetching, so identities that merely write records cannot move the swarm up a level); averaged over the shards of a level read in the windows before the newest (which is
  still filling up) and summed over the levels, that is this gather's estimate, smoothed across
  gathers.

Per node and per gather that is a bounded number of keys of bounded size, and each shard key is
read by about `shards_per_read * peers_per_shard` readers per window, whatever the swarm size.
Records found under a shard their owner does not belong in are refused by the caller
(`belongs`), so a peer cannot raise its chance of being read by writing into every shard.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial

from protocol import keys
from protocol.messages import ProtocolError

__all__ = ["ShardRead", "ShardedIndex", "level_for", "owned_key_schedule"]


@dataclass(frozen=True)
class ShardRead:
    """One index key to read: shard `shard` of level `level` of window `window`."""

    key: str
    window: int
    level: int
    shard: int


def level_for(peers: float, peers_per_shard: int, current: int | None = None,
              max_level: int = keys.MAX_SHARD_LEVEL) -> int:
    """The index level for an estimated `peers` per window.

    Without a current level: the smallest L with peers <= peers_per_shard * 2**L. From a current
    level: up while shards would hold more than peers_per_shard, down while they would hold less
    than peers_per_shard / 4 (one level down would then hold less than half of peers_per_shard).
    """
    if not math.isfinite(peers) or peers <= 0:
        return 0 if current is None else current
    if current is None:
        wanted = math.ceil(math.log2(max(1.0, peers / peers_per_shard)))
        return max(0, min(max_level, wanted))
    level = current
    while level < max_level and peers > peers_per_shard * 2**level:
        level += 1
    while level > 0 and peers < peers_per_shard * 2**level / 4:
        level -= 1
    return level


class ShardedIndex:
    """One node's view of the sharded index: its level, its estimate, its read plan.

    The write side (`write_key`, `forget_before`) and the read side (`read_plan`, `observe`) may
    run in two threads (a node publishes while its gather runs); each side is called from one
    thread at a time, and they share only `level`, an int replaced whole.
    """

    def __init__(self, swarm_id: str, peer_id: str, *, peers_per_shard: int = 16, shards_per_read: int = 1,
                 probe_windows: int = 2, rediscover_every: int = 10, smoothing: float = 0.5,
                 max_level: int = keys.MAX_SHARD_LEVEL) -> None:
        if peers_per_shard < 1 or shards_per_read < 1 or not 0 < smoothing <= 1:
            raise ValueError("peers_per_shard and shards_per_read must be >= 1, smoothing in (0, 1]")
        if not 0 <= max_level <= keys.MAX_SHARD_LEVEL:
            raise ValueError(f"max_level must be in [0, {keys.MAX_SHARD_LEVEL}]")
        self.swarm_id = keys.check_name(swarm_id)
        self.peer_id = peer_id
        self.peers_per_shard = peers_per_shard
        self.shards_per_read = shards_per_read
        self.probe_windows = probe_windows
        self.rediscover_every = rediscover_every
        self.smoothing = smoothing
        self.max_level = max_level
        self.level = 0
        self.estimated_peers: float | None = None  # None until the first gather that found anyone
        self._empty_gathers = 0
        self._write_keys: dict[int, str] = {}  # window -> key this node's record of it lives under

    # ---- writing --------------------------------------------------------------------------

    def write_key(self, window: int) -> str:
        """The key of this node's index record of `window` (fixed at its first publish)."""
        key = self._write_keys.get(window)
        if key is None:
            key = keys.rollout_index_key(self.swarm_id, window, self.level, keys.index_shard(self.peer_id, self.level))
            self._write_keys[window] = key
        return key

    def forget_before(self, oldest_window: int) -> None:
        for w in [w for w in self._write_keys if w < oldest_window]:
            del self._write_keys[w]

    # ---- reading --------------------------------------------------------------------------

    @property
    def probe_level(self) -> int:
        """The neighbouring level other nodes may be at: the one whose threshold the estimate is
        nearer to (up above half the shard size, down below it)."""
        half = self.peers_per_shard * 2**self.level / 2
        return self.level + 1 if (self.estimated_peers or 0.0) > half else self.level - 1

    @property
    def discovering(self) -> bool:
        return self.estimated_peers is None or self._empty_gathers >= self.rediscover_every

    def read_plan(self, windows: Sequence[int], rng: random.Random) -> list[ShardRead]:
        """The keys to read in one gather over `windows` (any order; the newest are probed)."""
        windows = sorted(set(windows))
        plan: dict[str, ShardRead] = {}

        def add(window: int, level: int, count: int) -> None:
            for shard in rng.sample(range(2**level), min(count, 2**level)):
                key = keys.rollout_index_key(self.swarm_id, window, level, shard)
                plan.setdefault(key, ShardRead(key, window, level, shard))

        newest = windows[-self.probe_windows:] if self.probe_windows > 0 else []
        for w in windows:
            add(w, self.level, self.shards_per_read)
            if w in newest and 0 <= self.probe_level <= self.max_level:
                add(w, self.probe_level, 1)
        if self.discovering and windows:  # in the newest complete window (see _estimate)
            for level in range(self.max_level + 1):
                add(windows[-2] if len(windows) > 1 else windows[-1], level, 1)
        return list(plan.values())

    @staticmethod
    def belongs(owner: str, read: ShardRead) -> bool:
        """Whether `owner`'s records may live in the shard `read` names."""
        try:
            return keys.index_shard(owner, read.level) == read.shard
        except ProtocolError:
            return False

    def observe(self, owners: Mapping[ShardRead, int]) -> float:
        """Update the estimate and level from the number of (valid) owners found in each shard
        read by one gather; returns this gather's raw estimate of peers per window (0: none found)."""
        estimate = _estimate(owners)
        if estimate <= 0:
            self._empty_gathers += 1
            return 0.0
        first = self.discovering
        self._empty_gathers = 0
        if first:
            self.estimated_peers = estimate
            self.level = level_for(estimate, self.peers_per_shard, None, self.max_level)
        else:
            self.estimated_peers += self.smoothing * (estimate - self.estimated_peers)
            self.level = level_for(self.estimated_peers, self.peers_per_shard, self.level, self.max_level)
        return estimate


def _estimate(owners: Mapping[ShardRead, int]) -> float:
    """Peers per window from the owners found per shard: for each level, owners per shard read
    (pooled over the windows) times 2**level, summed over levels. The newest window is still
    filling up, so it counts only when the older windows held nobody."""
    newest = max((r.window for r in owners), default=0)
    for windows in ("older", "newest"):
        found: dict[int, list[int]] = defaultdict(lambda: [0, 0])  # level -> [owners, shards read]
        for read, n in owners.items():
            if (read.window == newest) == (windows == "newest"):
                found[read.level][0] += n
                found[read.level][1] += 1
        estimate = sum(n / shards * 2**level for level, (n, shards) in found.items())
        if estimate > 0:
            return estimate
    return 0.0


def owned_key_schedule(swarm_id: str, window_seconds: float, staleness_windows: int) -> Callable[[float], list[str]]:
    """Raw keys that hold only owned records at DHT time `now` (for the DHT's schema validator):
    every status shard and every index shard (all levels) of the windows around `now`."""

    status_keys = keys.status_keys(swarm_id)
    window_keys = lru_cache(maxsize=2 * staleness_windows + 16)(partial(keys.window_index_keys, swarm_id))

    def keys_at(now: float) -> list[str]:
        w = keys.window_of(now, window_seconds)
        lo = max(0, w - staleness_windows - 2)
        return status_keys + [k for i in range(lo, w + 3) for k in window_keys(i)]

    return keys_at
