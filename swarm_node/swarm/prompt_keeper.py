"""Durable prompt sets: the nodes that use a seeded set keep its records alive after the seeder leaves.

A seeded set is a signed manifest under `keys.prompt_manifest_key(swarm, set)` plus content-addressed
chunks (swarm/prompts.py), all expiring at a DHT time. Without a seeder re-seeding them they lapse
one TTL after it stops, and a node that joins later cannot load the set, although every running
node still uses it. A `PromptSetKeeper` beside each such node re-stores the records before they
lapse.

Who may write what. The manifest key is not owner-protected: like every owned key of the swarm it
holds one subkey per writer (`[owner:<writer's key>]`, signed by the writer, swarm/validators.py),
and the trust anchor is the operator's signature *inside* the manifest bytes, not the subkey. So a
re-storer writes the exact manifest bytes it verified into its *own* subkey: the operator's signed
record, byte for byte, with the re-storer's signature on the DHT record only saying who stored the
copy. Readers (`prompts.load_prompt_set`) accept any subkey whose manifest verifies against the
expected operator key and prompt-set id, so a copy is as good as the original and a hostile writer
can add only copies that fail verification (counted, skipped). Chunks are blobs keyed by their own
hash: storing the same bytes again only moves their expiration. Nobody writes the operator's
subkey but the operator, and no re-storer signs anything on the operator's behalf.

What is re-stored. Only records this node verified: a manifest that passes `prompts.read_records`
(signature, operator key, id) and chunks whose bytes hash to the manifest's digests (the
transport's `get_blobs` checks). A node fetches its share once, when it first verifies the manifest
(so it knows at once whether it holds the whole set, and holds the bytes should the set lapse), and
keeps the bytes (no re-fetch per round; a chunk that failed is tried again at the next re-store).

Budget (`swarm.prompt_set_restore_budget_bytes`). A node holds and re-stores at most that many
bytes of a set (manifest plus chunks), about once per TTL. A set larger than the budget is kept
alive collectively: each node takes a run of the chunk list starting at an offset drawn from its
peer id, so nodes cover different chunks (swarm/chunk_share.py); the set survives if together they
cover all of it.

When (jitter, no stampede). After each read of the key the keeper knows the set's expiration E
(the latest of its verified manifest copies) and draws its next re-store at a uniformly random
point of the last third of the remaining lifetime R = E - now, the last twelfth left free: nodes
that hold the whole set in [2/3 R, 5/6 R), nodes that hold a part in [5/6 R, 11/12 R). At that
time it reads the key again. If nobody extended the set meanwhile, it stores its chunks and the
manifest in one batch, expiring at now + `swarm.record_ttl_s`. If another node did (a later E), a
node holding the whole set only draws again (the extender stored everything it stores), while a
node holding a part still stores its chunks (the extender may not hold them) but not the manifest.
Part-holders never extend the manifest before every whole-set holder's window has passed, so a
whole-set holder that skips has always been preceded by one that stored the whole set. Each
lifetime thus sees about one whole-set re-store (plus the few nodes whose times fall within one
read of each other) instead of one per node, and one re-store of each part per part-holder.

The end of a set. A verified tombstone from the set's owner key (prompts.end_prompt_set, `swarm-node
end-prompt-set`) stops the keeper's re-stores of that set for good; it logs that once and replaces
its own manifest copy by the tombstone (same subkey, expiring no earlier), so the set lapses within
one TTL and the tombstone is held by more than one writer. A tombstone ends the manifests of its key
created (DHT time) at or before it: the operator may seed the set again later (a replayed old
tombstone cannot end it for good), though a node that saw the end does not re-store it again. A
tombstone that fails verification ends nothing and is counted (`tombstone_bad_signature`,
`tombstone_wrong_owner`, ...), as is any other bad record under the key.

The successor (`follow`, for a node whose operator key is configured). A keeper that follows also
reads the key every `watch_interval_s` between re-stores, so it sees the end within that time
(whether or not it re-stores: budget 0 only watches). At a verified tombstone that names a
successor, its thread loads the successor (`prompts.load_followed`: same operator key, a chain of
ends followed to its end, again every `watch_interval_s` while it is not found; an end that leads
nowhere is final, and the node stays on its set). The step loop takes it at a step boundary through
`step_metrics`: the node switches its parts (`on_successor`, set by the node's assembly), the keeper
keeps the successor alive from then on as it kept the ended set, and the step counts
`prompt_set_switches`.

The keeper runs in a daemon thread (`start`), off the training step: a tick reads one key when a
re-store or a watch read is due and does nothing otherwise. The node reads `step_metrics()` and
`take_drops()` each step (re-stores, bytes, switches); a failure of the keeper's own code surfaces
there, in the step loop.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import Counter
from collections.abc import Callable

from protocol import keys
from protocol.messages import PromptSetTombstone
from swarm_node.metric_names import PROMPT_SET_RESTORED_BYTES, PROMPT_SET_RESTORES, PROMPT_SET_SWITCHES
from swarm_node.swarm.chunk_share import ChunkShare
from swarm_node.swarm.periodic import PeriodicThread
from swarm_node.swarm.prompts import (
    FollowedSet,
    PromptSetEnded,
    PromptSetError,
    PromptSetRecords,
    VerifiedRecord,
    ended_message,
    load_followed,
    read_records,
    valid_successor,
)
from swarm_node.swarm.transport import DropCounter, Transport

log = logging.getLogger(__name__)

# Re-store windows, as fractions of the remaining lifetime R at the draw: all in its last third,
# its last twelfth left free. Nodes holding the whole set draw first, nodes holding part of it after.
FULL_WINDOW = (2.0 / 3.0, 5.0 / 6.0)
PARTIAL_WINDOW = (5.0 / 6.0, 11.0 / 12.0)


def restore_time(now: float, expiration: float, u: float, partial: bool = False) -> float:
    """When to re-store a set expiring at `expiration`, seen at `now`, for a uniform draw `u` in [0, 1)."""
    lo, hi = PARTIAL_WINDOW if partial else FULL_WINDOW
    return now + max(0.0, expiration - now) * (lo + u * (hi - lo))


class PromptSetKeeper(PeriodicThread):
    """Keeps one prompt set alive from one node. `tick()` is one check (tests drive it with a fake
    transport and clock); `start()` runs it every `check_interval_s` in a daemon thread.

    owner: the operator key the set must be signed with (None: the key of the first verified
    manifest read, which then must also sign the tombstone). ttl_s: the expiration given to each
    re-store (the node's `swarm.record_ttl_s`). budget_bytes: manifest plus chunks held and re-stored.
    follow: load the successor an end names (needs `owner`: see prompts.py), read the key every
    `watch_interval_s` (default ttl_s / 3); on_successor: the node's switch to a loaded successor,
    called by `step_metrics` in the step loop.
    """

    thread_name = "prompt-keeper"

    def __init__(self, transport: Transport, swarm_id: str, prompt_set_id: str, owner: str | bytes | None, *,
                 ttl_s: float, budget_bytes: int, timeout: float = 10.0, rng: random.Random | None = None,
                 check_interval_s: float | None = None, follow: bool = False, watch_interval_s: float | None = None,
                 on_successor: Callable[[FollowedSet], None] | None = None) -> None:
        if ttl_s <= 0 or budget_bytes < 0:
            raise ValueError(f"ttl_s must be > 0 and budget_bytes >= 0, got {ttl_s}, {budget_bytes}")
        if follow and owner is None:
            raise ValueError("following a successor needs the operator key (owner)")
        self.transport = transport
        self.swarm_id = swarm_id
        self.owner = owner.encode() if isinstance(owner, str) else owner
        self.ttl_s, self.timeout = ttl_s, timeout
        self.rng = rng or random.Random()
        self.check_interval_s = check_interval_s or min(10.0, max(0.05, ttl_s / 30.0))
        self.follow, self.on_successor = follow, on_successor
        self.watch_interval_s = watch_interval_s or ttl_s / 3.0
        self.restores = 0
        self.restored_bytes = 0
        self.skipped = 0  # due times at which another node had already extended the set
        self.switches = 0  # successors the node took (step_metrics)
        self.drops = DropCounter()
        self._budget = budget_bytes
        self._reported = (0, 0, 0, DropCounter())
        self._error: BaseException | None = None
        self._drops_lock = threading.Lock()  # the step loop copies `drops` while this thread counts
        self._lock = threading.Lock()  # a tick against the step loop's switch to a successor
        self._keep(keys.check_name(prompt_set_id, "prompt set id"))
        self._init_thread()

    def _keep(self, prompt_set_id: str) -> None:
        """Start keeping `prompt_set_id` (at construction, and when the node switched to a successor)."""
        self.prompt_set_id = prompt_set_id
        self.key = keys.prompt_manifest_key(self.swarm_id, prompt_set_id)
        self.budget_bytes = self._budget
        self.due = self._watch_due = float("-inf")  # first tick reads the key
        self.expiration: float | None = None  # the set's expiration the current `due` was drawn from
        self.ended: PromptSetTombstone | None = None
        self.manifest: VerifiedRecord | None = None  # the verified manifest record held
        self.share: ChunkShare | None = None  # the chunks of it held (within the budget), from the first fill
        self._drawn = (0.0, 0.0, 0.0)  # (now, expiration, u) of the last draw of `due`
        self._seen_bad: set[tuple[str, float]] = set()
        self.successor: FollowedSet | None = None  # loaded after the end, until the node takes it
        self.follow_failed: str | None = None  # why the end leads nowhere this node can follow
        self._follow_due = float("-inf")
        self._follow_warned = False

    # ---- one check ------------------------------------------------------------------------

    def tick(self) -> None:
        """Re-store the set if it is due, or look for its end if a watch read is due (reading the key
        first); after the end, load the successor to follow; otherwise nothing."""
        with self._lock:
            self._tick()

    def _tick(self) -> None:
        if self.ended is not None:
            self._follow(self.ended)
            return
        if self.budget_bytes == 0 and not self.follow:
            return
        now = self.transport.dht_time()
        restore_due = self.budget_bytes > 0 and now >= self.due
        if not restore_due and not (self.follow and now >= self._watch_due):
            return
        self._watch_due = now + self.watch_interval_s
        records = self._read()
        tombstone = self._tombstone(records)
        if tombstone is not None:
            self._end(tombstone, records, now)
            return
        if not restore_due:
            return  # a watch read: only the end is looked for
        live = records.live_manifests()
        if self.manifest is None and live and not self._adopt(live[0]):
            return
        if self.manifest is None:  # nothing verified to keep (gone, late, or only bad copies): look again soon
            self.due = now + min(self.ttl_s / 3.0, 3 * self.check_interval_s)
            return
        latest = max((r.item.expiration_time for r in live), default=None)
        if latest is None and self.expiration is not None and now < self.expiration:
            self.due = now + self.check_interval_s  # the set cannot have lapsed yet: the read came back late
            return
        extended = latest is not None and self.expiration is not None and latest > self.expiration
        if latest is not None and self.expiration is None and latest - now > self.check_interval_s:
            expiration = latest  # first sight: draw the time of the first re-store
        elif extended and not self.partial:
            self.skipped += 1  # another node extended the set since the draw: no store, a new draw
            expiration = latest
        elif extended:
            self._restore(now, with_manifest=False)  # the manifest was extended; this node's chunks may not be
            expiration = latest
        else:  # due (or lapsed: this node still holds the verified records and revives them)
            was_whole = not self.partial
            self._fill_share()
            if self.partial and was_whole and self.expiration is not None and latest is not None and latest > now:
                self.due = max(now, restore_time(*self._drawn, partial=True))  # learnt it holds a part: wait
                return  # for the nodes that hold the whole set (see the module docstring)
            expiration = max(latest or now, self._restore(now))
        self.expiration = expiration
        self._drawn = (now, expiration, self.rng.random())
        self.due = restore_time(*self._drawn, partial=bool(self.partial))

    def _read(self) -> PromptSetRecords:
        """One read of the manifest key, sorted (prompts.read_records); bad records counted once."""
        entries = self.transport.get_all(self.key, self.timeout)
        records = read_records(entries, self.prompt_set_id, self.owner)
        if self.owner is None and records.manifests:
            self.owner = records.manifests[0].message.owner_public_key  # pin the key the set is signed with
            records = read_records(entries, self.prompt_set_id, self.owner)
        self._count_rejected(records.rejected, entries)
        return records

    def _tombstone(self, records: PromptSetRecords) -> PromptSetTombstone | None:
        """The verified tombstone that ends the manifest this node holds (before it holds one: any
        tombstone of the set's key, when no manifest is left that it does not end)."""
        if self.manifest is not None:
            return records.ends(self.manifest.message)  # type: ignore[arg-type]
        if self.owner is not None and not records.live_manifests():
            return records.tombstone_for(self.owner)
        return None

    def _adopt(self, record: VerifiedRecord) -> bool:
        """Hold `record` (a verified manifest) and fetch this node's share of its chunks, while they
        surely exist; False (and re-store nothing, ever) if the manifest alone exceeds the budget."""
        if len(record.item.value) > self.budget_bytes:
            log.warning("prompt set %s: its manifest alone (%d bytes) exceeds "
                        "swarm.prompt_set_restore_budget_bytes=%d: this node does not re-store it",
                        self.prompt_set_id, len(record.item.value), self.budget_bytes)
            self.budget_bytes = 0
            return False
        self.manifest = record
        self._fill_share()
        return True

    def _restore(self, now: float, with_manifest: bool = True) -> float:
        """Store the held chunks (and the manifest); returns the manifest's new expiration, or `now`."""
        assert self.manifest is not None
        chunks = [self.chunks[d] for d in self._fill_share()]
        expiration = now + self.ttl_s
        self.restores += 1
        self.restored_bytes += sum(map(len, chunks))
        if not with_manifest:
            self.transport.put_blobs(chunks, expiration, self.timeout)
            return now
        self.restored_bytes += len(self.manifest.item.value)
        if not self.transport.put_blobs_and_owned(chunks, self.key, self.manifest.item.value, expiration,
                                                  self.timeout):
            self._drop("restore_refused")
            return now
        return expiration

    @property
    def chunks(self) -> dict[str, bytes]:
        """The verified chunk bytes this node holds of the set, by digest."""
        return self.share.chunks if self.share is not None else {}

    @property
    def partial(self) -> bool:
        """Whether the set turned out larger than the budget (this node keeps a part of it)."""
        return self.share is not None and self.share.partial

    def _fill_share(self) -> list[str]:
        """The digests this node keeps alive (`ChunkShare.fill`; the share is made for the held
        manifest at the first call)."""
        manifest = self.manifest
        assert manifest is not None
        if self.share is None:
            self.share = ChunkShare(self.transport, manifest.message.chunk_digests,
                                    self.budget_bytes - len(manifest.item.value), self.timeout, self._drop)
        return self.share.fill()

    def _end(self, tombstone: PromptSetTombstone, records: PromptSetRecords, now: float) -> None:
        self.ended = tombstone
        if self.follow and tombstone.successor:
            log.info("prompt set %s was ended by its operator: this node no longer re-stores it and follows its "
                     "successor %s", self.prompt_set_id, tombstone.successor)
        else:
            log.info("%s: this node no longer re-stores it", ended_message(self.prompt_set_id, tombstone))
        mine = [r for r in records.manifests if r.writer == self.transport.peer_id]
        record = next(r for r in records.tombstones if r.message is tombstone)
        expiration = max([record.item.expiration_time, *(r.item.expiration_time for r in mine)])
        if mine and expiration > now:  # replace this node's copy of the manifest by the tombstone
            self.transport.store_owned(self.key, record.item.value, expiration, self.timeout)
        self.manifest, self.share = None, None

    def _follow(self, ended: PromptSetTombstone) -> None:
        """Load the successor `ended` names (once; again every watch interval while it is not found)."""
        if not self.follow or not ended.successor or self.successor is not None or self.follow_failed:
            return
        if not valid_successor(ended):
            self.follow_failed = f"its tombstone names no valid successor ({ended.successor!r})"
            log.warning("prompt set %s was ended by its operator, and %s: this node goes on training on it",
                        self.prompt_set_id, self.follow_failed)
            return
        now = self.transport.dht_time()
        if now < self._follow_due:
            return
        try:
            self.successor = load_followed(self.transport, self.swarm_id, ended.successor, self.owner,
                                           timeout=self.timeout, ended=(self.prompt_set_id,))
        except PromptSetEnded as e:  # the chain leads nowhere: the node stays where it is
            self.follow_failed = str(e)
            log.warning("%s: this node goes on training on %s", e, self.prompt_set_id)
        except PromptSetError as e:  # not (yet) found, or no copy verified: look again later
            self._follow_due = now + self.watch_interval_s
            if not self._follow_warned:
                log.warning("%s: this node trains on %s meanwhile and tries again every %.0fs", e,
                            self.prompt_set_id, self.watch_interval_s)
                self._follow_warned = True

    def _count_rejected(self, rejected: dict[str, str], entries: dict) -> None:
        """Count each bad record once (the same record is read again at every check)."""
        for writer, reason in rejected.items():
            seen = (writer, entries[writer].expiration_time)
            if seen not in self._seen_bad:
                self._seen_bad.add(seen)
                self._drop(reason)
        if len(self._seen_bad) > 4096:
            self._seen_bad.clear()

    def _drop(self, reason: str) -> None:
        with self._drops_lock:
            self.drops.add(reason)

    # ---- what the node reads each step ------------------------------------------------------

    def step_metrics(self) -> dict[str, float]:
        """Re-stores, bytes and switches since the last call; raises what stopped the keeper's thread,
        if anything. Called between steps: a loaded successor is handed to `on_successor` here (the
        node switches; if that raises, nothing changed here), then kept alive instead of the ended set."""
        if self._error is not None:
            raise RuntimeError(f"the prompt-set keeper failed: {self._error}") from self._error
        followed = self.successor
        if followed is not None and self.on_successor is not None:
            self.on_successor(followed)
            with self._lock:
                self._keep(followed.prompt_set.id)
            self.switches += 1
        restores, restored_bytes, switches, _ = self._reported
        self._reported = (self.restores, self.restored_bytes, self.switches, self._reported[3])
        return {PROMPT_SET_RESTORES: float(self.restores - restores),
                PROMPT_SET_RESTORED_BYTES: float(self.restored_bytes - restored_bytes),
                PROMPT_SET_SWITCHES: float(self.switches - switches)}

    def take_drops(self) -> Counter:
        """Bad records and failed fetches counted since the last call, by reason."""
        seen = self._reported[3]
        with self._drops_lock:
            now = DropCounter(self.drops)
        self._reported = (*self._reported[:3], now)
        return Counter({k: v - seen.get(k, 0) for k, v in now.items() if v - seen.get(k, 0) > 0})

    # ---- background thread (swarm/periodic.py) ----------------------------------------------

    def _wants_thread(self) -> bool:
        return self.budget_bytes > 0 or self.follow

    def _tick_once(self) -> bool:
        try:
            self.tick()
        except RuntimeError:
            raise  # the transport shut down: PeriodicThread stops quietly
        except Exception as e:  # noqa: BLE001  (surfaced in the step loop by step_metrics)
            self._error = e
            return False
        # an ended set that names a successor to follow keeps the thread (it loads it, then keeps it alive)
        return self.ended is None or (self.follow and bool(self.ended.successor) and self.follow_failed is None)
