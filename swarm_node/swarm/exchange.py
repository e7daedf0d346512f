"""Publishing and gathering rollout groups and status records over a Transport.

Layout (keys from `protocol.keys`): each encoded RolloutGroup is split into content-addressed
chunks (at most CHUNK_BYTES each); a small RolloutIndex listing this node's groups of one time
window lives in this node's own subkey of one shard of that window's index (`index.ShardedIndex`:
the shard count grows with the swarm; a small swarm uses one key per window). Each publish
re-stores the merged index of the window; `republish()` extends records that still matter.

Gathering reads the index shards `index.ShardedIndex` plans for the last `staleness_windows + 1`
windows (a bounded number; a record in a shard its owner is not in is an `index_mismatch`), picks
a bounded random sample of entries (`max_groups` in all, `max_per_peer` per peer, at most
`max_bytes_per_peer` of chunks per peer: `sampling.fair_sample`), fetches their chunks concurrently
under one deadline, then decodes and checks each group. An entry is judged before its chunks are
fetched as far as it can be (`group_checks.RecordChecks`: a version-4 entry declares its group's
tokenizer, text and G, so a group this node cannot use costs no download). What earlier gathers saw
is not judged again, and a fetch that failed may be retried (`gather_book.GatherBook`). Nothing a
peer sends raises: every rejected record or group is counted under every reason it has (see
`group_checks` and `protocol.validate`), and judged by its worst one (`verdicts.py`).

Left to the node (it holds the state): the prompt reference against its own prompt set
(`unknown_prompt`) and, unless `tokenizer_fingerprint` is given here, the tokenizer check; a
`group_filter` hook lets the caller add checks that return a drop reason. An `Admission`
(admission.py) adds the bounded-influence rules; a gather that drops far more than it takes is
logged (at most once a minute) as degraded exchange; a `ledger` (`ledger.PeerLedger`) gets each drop.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from protocol import codec, keys
from protocol.messages import IndexEntry, NodeStatus, ProtocolError, RolloutGroup, RolloutIndex
from protocol.validate import MAX_TEMPERATURE, MIN_TEMPERATURE, ValidationLimits
from swarm_node.swarm.admission import Admission, DegradedExchangeLog, fair_sample
from swarm_node.swarm.gather_book import GatherBook
from swarm_node.swarm.group_checks import (
    BAD_TIMESTAMP,
    DUPLICATE,
    FUTURE,
    INDEX_MISMATCH,
    MIN_CHUNK_BYTES,
    OVERSIZED,
    STALE,
    RecordChecks,
    fetch_cost,
)
from swarm_node.swarm.index import ShardedIndex, ShardRead
from swarm_node.swarm.statuses import (
    BAD_VERSION,
    DECODE_ERROR,
    SENDER_MISMATCH,
    WRONG_TYPE,
    decode_reason,
    read_statuses,
)
from swarm_node.swarm.tokenizers import TokenizerCensus
from swarm_node.swarm.verdicts import is_fault
from swarm_node.swarm.transport import MAX_BLOB_BYTES, MAX_RECORD_BYTES, DropCounter, Transport

CHUNK_BYTES = 512 << 10
MAX_INDEX_ENTRIES = 256  # per node per window; an index entry is ~150-250 bytes, the record <= 64 KiB
FETCH_TIMEOUT = "fetch_timeout"

RETRY_MIN_S = 1.0  # index keys that timed out are read once more when at least this much time is left

__all__ = [  # with the drop reasons of this module's vocabulary
    "BAD_TIMESTAMP", "BAD_VERSION", "CHUNK_BYTES", "DECODE_ERROR", "DUPLICATE", "FETCH_TIMEOUT", "FUTURE",
    "INDEX_MISMATCH", "MIN_CHUNK_BYTES", "OVERSIZED", "SENDER_MISMATCH", "STALE", "WRONG_TYPE", "DropCounter",
    "RolloutExchange",
]


@dataclass
class _Candidate:
    owner: str
    window: int
    entry: IndexEntry


class RolloutExchange:
    """Publish own groups, gather peers' groups, publish/read status records.

    `vocab_size` and `max_new_tokens` bound what is accepted (token ids and completion length);
    `record_ttl_s` is how long records live; `max_group_bytes` caps one encoded group.
    `index_peers_per_shard` and `index_shards_per_read` shape the sharded index (`index.py`);
    groups declaring a sampling temperature outside `temperature_range` are `unsupported_temperature`;
    `max_bytes_per_peer` (default 2 x `max_group_bytes`, which one largest group in 512 KiB chunks
    needs) bounds what one sender's entries can make a gather download (`group_checks.fetch_cost`:
    1 MiB a chunk), raised to one chunk per slot of `max_per_peer` where that is more.
    """

    def __init__(
        self,
        transport: Transport,
        swarm_id: str,
        *,
        vocab_size: int,
        max_new_tokens: int = 4096,
        max_group_size: int = 256,
        record_ttl_s: float = 300.0,
        window_seconds: float = 30.0,
        max_group_bytes: int = 8 << 20,
        tokenizer_fingerprint: str | None = None,
        group_filter: Callable[[RolloutGroup], str | None] | None = None,
        store_timeout: float = 10.0,
        min_group_size: int = 1,
        admission: Admission | None = None,
        index_peers_per_shard: int = 16,
        index_shards_per_read: int = 1,
        temperature_range: tuple[float, float] = (MIN_TEMPERATURE, MAX_TEMPERATURE),
        ledger: Any | None = None,
        cross_tokenizer: bool = False,
        max_bytes_per_peer: int | None = None,
    ) -> None:
        self.transport = transport
        self.swarm_id = keys.check_name(swarm_id)
        self.record_ttl_s = record_ttl_s
        self.window_seconds = window_seconds
        self.max_group_bytes = max_group_bytes
        self.max_bytes_per_peer = 2 * max_group_bytes if max_bytes_per_peer is None else max_bytes_per_peer
        self.store_timeout = store_timeout
        self.admission = admission
        self.ledger = ledger
        self.limits = ValidationLimits(
            vocab_size=vocab_size, max_tokens_per_completion=max_new_tokens, max_group_size=max_group_size,
            min_group_size=min_group_size, expected_swarm_id=swarm_id,
            expected_tokenizer_fingerprint=tokenizer_fingerprint,
            min_temperature=temperature_range[0], max_temperature=temperature_range[1],
            cross_tokenizer=cross_tokenizer)
        self._degraded = DegradedExchangeLog()
        self.tokenizers = TokenizerCensus(tokenizer_fingerprint or "", record_ttl_s)  # swarm.send_text = auto
        self.codec_limits = codec.Limits(max_encoded_bytes=max_group_bytes)
        self.drops = DropCounter()  # everything dropped so far (groups and status records)
        self.index = ShardedIndex(self.swarm_id, transport.peer_id, peers_per_shard=index_peers_per_shard,
                                  shards_per_read=index_shards_per_read)
        self._published: dict[int, list[IndexEntry]] = {}  # window -> own entries
        self._blobs: dict[str, bytes] = {}  # digest -> chunk, kept while its window matters
        self._blob_window: dict[str, int] = {}
        self._book = GatherBook(admission, ledger)  # what earlier gathers saw; counts each drop
        self.checks = RecordChecks(self.limits, window_seconds, max_group_bytes, self.max_bytes_per_peer,
                                   self.codec_limits, self._book.seen_groups, admission, group_filter)

    # ---- publishing ---------------------------------------------------------------------

    def publish_groups(self, groups: Sequence[RolloutGroup], window: int) -> float:
        """Publish groups of `window`; returns encoded bytes per token (0 if no tokens)."""
        now = self.transport.dht_time()
        expiration = now + self.record_ttl_s
        entries, blobs, total_bytes, total_tokens = [], [], 0, 0
        for group in groups:
            data = codec.encode(group)
            chunks = codec.split_chunks(data, CHUNK_BYTES)
            digests = tuple(codec.content_digest(c) for c in chunks)
            blobs.extend(chunks)
            for d, c in zip(digests, chunks):
                self._blobs[d], self._blob_window[d] = c, window
            has_text = bool(group.completions) and all(c.has_text for c in group.completions)
            entries.append(IndexEntry(chunk_digests=digests, size=len(data), prompt_index=group.prompt.index,
                                      policy_version=group.policy_version, created_at=group.created_at,
                                      tokenizer_fingerprint=group.tokenizer_fingerprint, has_text=has_text,
                                      group_size=len(group.completions)))
            total_bytes += len(data)
            total_tokens += group.num_tokens
        if self.admission is not None:
            self.admission.remember_own(groups, window)
        merged = (self._published.get(window, []) + entries)[-MAX_INDEX_ENTRIES:]
        self._published[window] = merged
        # Chunks and the index that lists them go out in one batch (one DHT traversal).
        self._store_index(window, merged, expiration, blobs)
        return total_bytes / total_tokens if total_tokens else 0.0

    def _store_index(self, window: int, entries: list[IndexEntry], expiration: float,
                     blobs: Sequence[bytes] = ()) -> bool:
        index = RolloutIndex(sender=self.transport.peer_id, window=window, entries=tuple(entries))
        data = codec.encode(index)
        while len(data) > MAX_RECORD_BYTES and len(entries) > 1:  # very long digests lists: keep newest
            entries = entries[len(entries) // 4 or 1:]
            data = codec.encode(RolloutIndex(sender=self.transport.peer_id, window=window, entries=tuple(entries)))
        return self.transport.put_blobs_and_owned(blobs, self.index.write_key(window), data,
                                                  expiration, self.store_timeout)

    def republish(self, current_window: int, staleness_windows: int) -> int:
        """Re-store own indexes and chunks of windows that still matter; forget older ones.

        Call about every `record_ttl_s / 3`. Returns how many windows were re-stored.
        """
        oldest = current_window - staleness_windows
        for w in [w for w in self._published if w < oldest]:
            del self._published[w]
        for d in [d for d, w in self._blob_window.items() if w < oldest]:
            del self._blob_window[d], self._blobs[d]
        self.index.forget_before(oldest)
        expiration = self.transport.dht_time() + self.record_ttl_s
        for w, entries in self._published.items():  # chunks and their window's index in one batch
            blobs = [self._blobs[d] for d, bw in self._blob_window.items() if bw == w]
            self._store_index(w, entries, expiration, blobs)
        return len(self._published)

    def publish_status(self, status: NodeStatus) -> bool:
        data = codec.encode(status)
        expiration = self.transport.dht_time() + self.record_ttl_s
        key = keys.status_key(self.swarm_id, keys.status_shard(self.transport.peer_id))  # its own shard only
        return self.transport.store_owned(key, data, expiration, self.store_timeout)

    def read_statuses(self, timeout: float, drops: Counter[str] | None = None) -> list[NodeStatus]:
        """Valid status records of live peers (including this node's), sorted by peer id. Their
        tokenizers are noted (`tokenizers`), and the receipts naming this node go to its ledger.
        Records dropped (`status_<reason>`) are counted in `self.drops`, and in `drops` when given."""
        read_drops = DropCounter()
        statuses = read_statuses(self.transport, self.swarm_id, self.limits, read_drops, timeout)
        self.drops.update(read_drops)
        if drops is not None:
            drops.update(read_drops)
        for status in statuses:
            self.tokenizers.note(status.tokenizer_fingerprint, self.transport.dht_time(),
                                 from_peer=status.peer_id != self.transport.peer_id)
        if self.ledger is not None:
            self.ledger.note_receipts(statuses)
        return statuses

    # ---- gathering ----------------------------------------------------------------------

    def fetch_groups(
        self,
        current_window: int,
        staleness_windows: int,
        max_groups: int,
        max_per_peer: int,
        timeout: float,
        rng: random.Random | None = None,
        exclude_self: bool = True,
    ) -> tuple[list[RolloutGroup], DropCounter]:
        """A bounded random sample of peers' fresh, valid groups, and the drops by reason."""
        deadline = time.monotonic() + timeout
        rng = rng or random.Random()
        drops = DropCounter()
        self._book.forget_before(current_window - staleness_windows)
        if self.admission is not None:
            self.admission.begin_gather()
        if max_groups <= 0 or max_per_peer <= 0:
            return [], drops
        windows = range(max(0, current_window - staleness_windows), current_window + 1)
        candidates = self._read_index(self.index.read_plan(windows, rng), deadline, current_window,
                                      staleness_windows, exclude_self, drops)
        chosen = self._sample(candidates, max_groups, max_per_peer, rng)
        groups = self._fetch_chosen(chosen, deadline, current_window, staleness_windows, drops)
        self.drops.update(drops)
        self._degraded.check(len(groups), drops)
        return groups, drops

    def _read_index(self, plan: list[ShardRead], deadline: float, current: int, staleness: int,
                    exclude_self: bool, drops: DropCounter) -> list[_Candidate]:
        """Candidates from the index shards of `plan`; tells the index how many owners each held.
        Keys that timed out in half the time left are read once more in half the time then left."""
        found, late = self.transport.get_all_many_late([r.key for r in plan],
                                                       timeout=max(0.0, (deadline - time.monotonic()) / 2))
        if late and deadline - time.monotonic() >= RETRY_MIN_S:
            again, _ = self.transport.get_all_many_late(sorted(late), timeout=(deadline - time.monotonic()) / 2)
            found.update(again)
        candidates: dict[tuple[str, tuple[str, ...]], _Candidate] = {}
        evaluated: set[tuple[str, tuple[str, ...]]] = set()  # entries checked in this gather
        owners: dict[ShardRead, int] = {}
        for read in plan:
            records = found.get(read.key, {})
            for owner, item in records.items():
                if exclude_self and owner == self.transport.peer_id:
                    continue
                refused = self.admission.peer_reason(owner) if self.admission is not None else None
                if refused is not None:  # this node's own rule: no verdict on the peer's data
                    self._book.drop(drops, refused, owner, verdict=False)
                    continue
                for c in self._index_candidates(owner, read, item.value, current, staleness, drops, evaluated):
                    candidates[(owner, tuple(c.entry.chunk_digests))] = c
            # The swarm-size estimate (hence the index level) counts this node and the owners whose
            # index of the window listed an admissible entry, now or in an earlier gather: identities
            # that only write records (a Sybil flood of the key) do not make the swarm look larger.
            owners[read] = sum(self.index.belongs(o, read) and (o == self.transport.peer_id
                                                                 or (o, read.window) in self._book.vouched)
                               for o in records)
        self.index.observe(owners)
        return list(candidates.values())

    def _index_candidates(self, owner: str, read: ShardRead, data: bytes, current: int, staleness: int,
                          drops: DropCounter, evaluated: set[tuple[str, tuple[str, ...]]]) -> list[_Candidate]:
        window = read.window
        record_id = (owner, codec.content_digest(data))
        if not self.index.belongs(owner, read):  # written into a shard its owner is not in
            record_id = (owner, read.key)
            self._book.reject_index(drops, INDEX_MISMATCH, owner, record_id, window)
            return []
        if record_id in self._book.bad_indexes:
            return []  # counted when first seen
        reason = None
        try:
            index = codec.decode(data)
        except ProtocolError:
            reason = decode_reason(data)
        else:
            if not isinstance(index, RolloutIndex):
                reason = WRONG_TYPE
            elif index.sender != owner:
                reason = SENDER_MISMATCH
            elif index.window != window:
                reason = INDEX_MISMATCH
        if reason is not None:
            self._book.reject_index(drops, reason, owner, record_id, window)
            return []
        out, listed = [], set()
        for entry in index.entries:
            digests = tuple(entry.chunk_digests)
            if digests in self._book.seen_digests:
                continue  # taken (or rejected and counted) in an earlier gather: not new data
            if digests in listed:
                self._book.drop(drops, DUPLICATE, owner)  # the same payload listed twice
                continue
            if (owner, digests) in evaluated:
                continue  # an owner that changed level within a window is listed in two shards
            listed.add(digests)
            evaluated.add((owner, digests))
            reasons = self.checks.entry_reasons(owner, entry, window, current, staleness)
            if not any(is_fault(r) for r in reasons):
                self._book.vouch(owner, window)  # a bound entry: an honest drop vouches for its owner too
            if reasons:
                self._book.reject_entry(drops, reasons, owner, digests, window, entry.tokenizer_fingerprint)
                continue
            out.append(_Candidate(owner, window, entry))
        return out

    def _sample(self, candidates: list[_Candidate], max_groups: int, max_per_peer: int,
                rng: random.Random) -> list[_Candidate]:
        """Fair over identities first, then groups (sampling.fair_sample), reputation-weighted, at
        most `max_bytes_per_peer` of chunks per sender."""
        def cost(c: _Candidate) -> float:
            return fetch_cost(c.entry)

        def recency(c: _Candidate) -> float:
            return c.window  # a peer's newest groups first (sampling.py, "Newest first")

        budget = max(self.max_bytes_per_peer, max_per_peer * MAX_BLOB_BYTES)  # a chunk per slot, at least
        if self.admission is not None:
            return self.admission.sample(candidates, max_groups, max_per_peer, rng, cost, budget, recency)
        return fair_sample(candidates, max_groups, max_per_peer, rng, cost=cost, max_cost_per_peer=budget,
                           recency=recency)

    def _fetch_chosen(self, chosen: list[_Candidate], deadline: float, current: int, staleness: int,
                      drops: DropCounter) -> list[RolloutGroup]:
        digests = [d for c in chosen for d in c.entry.chunk_digests]
        fetched = self.transport.get_blobs(digests, timeout=max(0.0, deadline - time.monotonic()))
        groups = []
        for c in chosen:
            digests_c = tuple(c.entry.chunk_digests)
            self._book.seen_digests[digests_c] = c.window
            failed = [fetched.failed[d] for d in digests_c if d in fetched.failed]
            if failed:
                self._book.fetch_failed(drops, failed[0], c.owner, digests_c, c.window)
                continue
            data = b"".join(fetched.found[d] for d in digests_c)
            reasons, group = self.checks.group_reasons(c.entry, c.owner, c.window, data, current, staleness)
            if group is not None:
                self.tokenizers.note(group.tokenizer_fingerprint, self.transport.dht_time())
            if reasons:  # the fingerprint of a group of its sender goes to the ledger
                self._book.drop(drops, reasons, c.owner, tokenizer=group.tokenizer_fingerprint if group else "",
                                fetched=True)
                continue
            self._book.take(group, c.owner, c.window)
            groups.append(group)
        return groups
