"""Hostile peers, round 3 (issue 40), through the in-memory DHT as an attacker writes it: a drop's
honest reasons cannot mask its faults, a group this node cannot use costs no download when its
entry declares it, each sender's downloads per gather are bounded, and identities whose groups are
never taken stop holding slots."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from protocol import codec, keys
from protocol.messages import IndexEntry, RolloutGroup, RolloutIndex
from swarm_node.peers.ledger import PeerLedger
from swarm_node.swarm.admission import Admission, Reputation
from swarm_node.swarm.exchange import RolloutExchange
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.synthetic import synthetic_group
from swarm_node.swarm.transport import MAX_BLOB_BYTES
from tests.fakes import Clock

SWARM = "round3"
WINDOW_S = 30.0
T0 = 3_000_000.0
OWN_FP, OTHER_FP = "fp-receiver", "fp-other"


class CountingTransport(MemoryTransport):
    """A receiver's transport that counts the chunk bytes it downloads apart from index records."""

    blob_bytes = 0

    def get_blobs(self, digests, timeout):
        before = self.traffic["bytes_in"]
        out = super().get_blobs(digests, timeout)
        self.blob_bytes += self.traffic["bytes_in"] - before
        return out


def receiver(swarm: MemorySwarm, **kw) -> tuple[RolloutExchange, CountingTransport, Reputation, PeerLedger]:
    rep = Reputation()
    ledger = PeerLedger(reputation=rep, clock=swarm.clock)
    transport = CountingTransport(swarm, "H")
    kw.setdefault("admission", Admission(reputation=rep))
    ex = RolloutExchange(transport, SWARM, vocab_size=49_152, max_new_tokens=256, window_seconds=WINDOW_S,
                         tokenizer_fingerprint=OWN_FP, cross_tokenizer=True, ledger=ledger, **kw)
    return ex, transport, rep, ledger


def group(sender: str, index: int, t: float, fp: str = OWN_FP, g: int = 4, tokens: int = 32) -> RolloutGroup:
    return synthetic_group(np.random.default_rng(index), swarm_id=SWARM, sender=sender, created_at=t,
                           prompt_index=index, group_size=g, tokens=tokens, tokenizer_fingerprint=fp)


def publish_raw(swarm: MemorySwarm, owner: str, groups: list[RolloutGroup], t: float, *, version: int,
                declare: dict | None = None) -> int:
    """`owner`'s chunks and index record of the window of `t`, as any peer can write them, each entry
    claiming the time `t`: a version-2 index declares nothing; a version-4 one what `declare` says
    (else the truth). Returns the groups' bytes."""
    window = keys.window_of(t, WINDOW_S)
    entries, total = [], 0
    for grp in groups:
        data = codec.encode(grp)
        chunks = codec.split_chunks(data, 512 << 10)
        for c in chunks:
            swarm.write_raw_blob(codec.content_digest(c), c, t + 300)
        fields = dict(chunk_digests=tuple(codec.content_digest(c) for c in chunks), size=len(data),
                      prompt_index=grp.prompt.index, policy_version=grp.policy_version, created_at=t)
        if version >= 4:
            fields.update(tokenizer_fingerprint=grp.tokenizer_fingerprint, group_size=len(grp.completions),
                          has_text=all(c.has_text for c in grp.completions))
            fields.update(declare or {})
        entries.append(IndexEntry(**fields))
        total += len(data)
    index = RolloutIndex(protocol_version=version, sender=owner, window=window, entries=tuple(entries))
    swarm.write_raw_owned(keys.rollout_index_key(SWARM, window), owner, codec.encode(index), t + 300)
    return total


def gather(ex: RolloutExchange, t: float, max_groups: int = 4, max_per_peer: int = 4, seed: int = 0):
    return ex.fetch_groups(keys.window_of(t, WINDOW_S), staleness_windows=2, max_groups=max_groups,
                           max_per_peer=max_per_peer, timeout=5.0, rng=random.Random(seed))


def breaks_every_rule(sender: str, index: int, t: float) -> RolloutGroup:
    """The issue's group: NaN logprobs, an unsupported top_p and temperature, a bad finish reason and a
    bad timestamp, declared under another tokenizer's fingerprint (and no text)."""
    g = group(sender, index, t, fp=OTHER_FP)
    first = g.completions[0]
    lp = first.logprobs.copy()
    lp[3] = np.nan
    broken = dataclasses.replace(first, logprobs=lp, finish_reason="weird")
    return dataclasses.replace(g, completions=(broken, *g.completions[1:]), created_at=float("nan"),
                               sampling=dataclasses.replace(g.sampling, top_p=0.9, temperature=5.0))


def test_a_group_breaking_several_rules_under_a_foreign_fingerprint_is_a_fault() -> None:
    swarm = MemorySwarm(clock=Clock(T0))
    ex, _, rep, ledger = receiver(swarm)
    bad = breaks_every_rule("M", 0, T0)
    # Listed as an old (version-2) entry claiming a fresh time, so the receiver must fetch it to judge it.
    publish_raw(swarm, "M", [bad], T0, version=2)
    got, drops = gather(ex, T0)
    # Every reason is counted (the group's time contradicts its entry's too); the honest one (another
    # tokenizer) masks none of them.
    assert got == [] and drops.as_dict() == {
        "tokenizer_mismatch": 1, "logprob_nonfinite": 1, "unsupported_top_p": 1, "unsupported_temperature": 1,
        "bad_finish_reason": 1, "bad_timestamp": 1, "index_mismatch": 1}
    assert rep.faults["M"] == pytest.approx(1.0)
    (row,) = ledger.rows()
    assert row["dropped_by_reason"] == {"bad_timestamp": 1}  # once, under its first fault
    # More of them: the sender is excluded (it was never, when the drop counted as `tokenizer_mismatch`).
    t = T0
    for k in range(1, 12):
        t += WINDOW_S
        publish_raw(swarm, "M", [breaks_every_rule("M", 10 * k + j, t) for j in range(2)], t, version=2)
        _, drops = gather(ex, t, seed=k)
        if drops["excluded_peer"]:  # counted once per index record of it read (3 windows)
            break
    assert drops["excluded_peer"] >= 1 and rep.excluded("M") and k <= 6, (k, dict(rep.faults))


def test_a_declaration_the_group_contradicts_is_a_fault() -> None:
    """A version-4 entry that declares this node's tokenizer for a group of another one is fetched
    and is an `index_mismatch` (a fault), beside the group's own reasons."""
    swarm = MemorySwarm(clock=Clock(T0))
    ex, transport, rep, _ = receiver(swarm)
    publish_raw(swarm, "L", [group("L", 0, T0, fp=OTHER_FP)], T0, version=4, declare={"tokenizer_fingerprint": OWN_FP})
    got, drops = gather(ex, T0)
    assert got == [] and drops.as_dict() == {"tokenizer_mismatch": 1, "index_mismatch": 1}
    assert rep.faults["L"] == pytest.approx(1.0) and transport.traffic["blobs_fetched"] == 1


def test_a_group_dropped_before_the_fetch_costs_no_download() -> None:
    swarm = MemorySwarm(clock=Clock(T0))
    ex, transport, rep, ledger = receiver(swarm, max_group_size=64)
    big = group("F", 0, T0, fp=OTHER_FP, g=16, tokens=256)  # another tokenizer, no text: unusable here
    size = publish_raw(swarm, "F", [big], T0, version=4)
    got, drops = gather(ex, T0)
    assert got == [] and drops.as_dict() == {"tokenizer_mismatch": 1}
    prefetch_bytes = transport.blob_bytes
    assert prefetch_bytes == 0 and transport.traffic["blobs_fetched"] == 0 and size > 10_000
    assert "F" not in rep.faults and rep.standing("F") == "newcomer"  # honest, and no slot was spent on it
    assert ledger.rows()[0]["tokenizer"] == OTHER_FP
    # The same group under an old entry that declares nothing is fetched as before: the bytes are paid.
    t = T0 + WINDOW_S
    old = dataclasses.replace(big, sender="F2", created_at=t)
    publish_raw(swarm, "F2", [old], t, version=2)
    got, drops = gather(ex, t)
    assert got == [] and drops.as_dict() == {"tokenizer_mismatch": 1}
    assert transport.blob_bytes == len(codec.encode(old)) and rep.standing("F2") == "probe"  # a slot missed
    # A declared G beyond this node's bounds is refused before the fetch too, as the fault it is.
    t += WINDOW_S
    publish_raw(swarm, "G", [group("G", 1, t)], t, version=4, declare={"group_size": 100})
    before = transport.blob_bytes
    _, drops = gather(ex, t)
    assert drops.as_dict() == {"group_too_large": 1} and transport.blob_bytes == before
    assert rep.faults["G"] == pytest.approx(1.0)
    print({"prefetch_drop_blob_bytes": prefetch_bytes, "old_entry_blob_bytes": len(codec.encode(old)),
           "group_bytes": size})


def test_each_sender_downloads_at_most_its_byte_budget_per_gather() -> None:
    """The budget charges an entry the most its chunks can hold (1 MiB each, known only once fetched):
    a sender listing chunks far larger than the size it claims gets a gather to download at most
    `max_bytes_per_peer` of it (at least a chunk per slot of its quota)."""
    swarm = MemorySwarm(clock=Clock(T0))
    transport = CountingTransport(swarm, "H")
    ex = RolloutExchange(transport, SWARM, vocab_size=49_152, max_new_tokens=256, window_seconds=WINDOW_S,
                         max_bytes_per_peer=3 * MAX_BLOB_BYTES)
    # Each entry claims 70 KiB (which allows 2 chunks) and lists 2 chunks of 1 MiB each.
    window = keys.window_of(T0, WINDOW_S)
    entries = []
    for k in range(4):
        blobs = [bytes([k, j]) * (MAX_BLOB_BYTES // 2) for j in range(2)]
        for b in blobs:
            swarm.write_raw_blob(codec.content_digest(b), b, T0 + 300)
        entries.append(IndexEntry(chunk_digests=tuple(codec.content_digest(b) for b in blobs), size=70 << 10,
                                  prompt_index=k, policy_version=0, created_at=T0))
    index = RolloutIndex(protocol_version=2, sender="B", window=window, entries=tuple(entries))
    swarm.write_raw_owned(keys.rollout_index_key(SWARM, window), "B", codec.encode(index), T0 + 300)
    got, drops = gather(ex, T0, max_groups=8, max_per_peer=2)  # quota 2 (4 MiB), budget 3 MiB: one entry
    assert got == [] and drops.as_dict() == {"index_mismatch": 1}
    assert transport.blob_bytes == 2 * MAX_BLOB_BYTES  # of the 8 MiB it listed
    # An entry whose chunk count alone could exceed the budget is refused before any download.
    many = IndexEntry(chunk_digests=tuple(codec.content_digest(bytes([k])) for k in range(5)), size=5 << 16,
                      prompt_index=9, policy_version=0, created_at=T0)
    swarm.write_raw_owned(keys.rollout_index_key(SWARM, window), "C",
                          codec.encode(RolloutIndex(sender="C", window=window, entries=(many,))), T0 + 300)
    before = transport.blob_bytes
    _, drops = gather(ex, T0, max_groups=8, max_per_peer=2)  # B's next entry, and nothing of C's
    assert drops.as_dict() == {"oversized": 1, "index_mismatch": 1}
    assert transport.blob_bytes - before == 2 * MAX_BLOB_BYTES


def test_identities_whose_groups_are_never_taken_hold_one_slot_in_all() -> None:
    """The issue's finding: six identities whose groups are never taken (another tokenizer without
    text, listed in old entries so they must be fetched: an honest drop each time) kept three of
    four slots in every one of 30 gathers. Now each is a miss of its sender; once each has missed,
    all six share one probe slot, and the honest peer's group is taken in every gather."""
    swarm = MemorySwarm(clock=Clock(T0))
    ex, transport, rep, _ = receiver(swarm)
    honest = RolloutExchange(MemoryTransport(swarm, "honest"), SWARM, vocab_size=49_152, window_seconds=WINDOW_S)
    idle = [f"idle{k}" for k in range(6)]
    held, honest_taken = [], 0
    for n in range(30):
        t = swarm.clock.t = T0 + n * WINDOW_S
        honest.publish_groups([group("honest", 1000 + n, t)], keys.window_of(t, WINDOW_S))
        for k, p in enumerate(idle):
            publish_raw(swarm, p, [group(p, 100 * n + 10 * k + j, t, fp=OTHER_FP) for j in range(4)], t, version=2)
        got, drops = gather(ex, t, seed=n)
        honest_taken += sum(g.sender == "honest" for g in got)
        held.append(drops["tokenizer_mismatch"])  # each of their groups fetched is dropped so
        assert set(drops) <= {"tokenizer_mismatch"}, drops
    all_missed = 3  # 6 identities through one newcomer seat, the leftovers and the probe seat
    assert held[0] == 3 and max(held[all_missed:]) <= 1, held
    assert honest_taken == 30 and not any(rep.excluded(p) for p in idle)
    print({"slots_held_by_six_per_gather": held, "after_gather": all_missed,
           "slots_in_gathers_after": sum(held[all_missed:]), "honest_taken": honest_taken})
