"""Durable prompt sets over the in-memory swarm with a hand-moved clock: nodes that use a set keep it
alive after the seeder leaves, within their byte budget, at jittered times, never re-storing what
they could not verify, and stop when the operator ends the set."""

from __future__ import annotations

import dataclasses
import logging
import random
import statistics

import pytest

from protocol import codec, keys
from swarm_node.swarm import prompts
from swarm_node.swarm.identity import load_or_create_key
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.prompt_keeper import PromptSetKeeper, restore_time
from swarm_node.swarm.prompts import PromptSetEnded, PromptSetError, end_prompt_set, load_prompt_set, seed_prompt_set
from swarm_node.tasks.base import Problem, PromptSet, content_id
from tests.fakes import Clock

SWARM = "unit"
TTL = 100.0


def _prompt_set(n: int = 60) -> PromptSet:
    problems = tuple(Problem(index=i, question=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(n))
    return PromptSet(id=content_id("arithmetic", problems), answer_kind="number", problems=problems)


@pytest.fixture(scope="module")
def operator(tmp_path_factory):
    return load_or_create_key(tmp_path_factory.mktemp("op") / "operator.key")


@pytest.fixture(scope="module")
def stranger(tmp_path_factory):
    return load_or_create_key(tmp_path_factory.mktemp("st") / "stranger.key")


@pytest.fixture
def seeded(operator):
    """(swarm, clock, prompt set, manifest): seeded once with TTL, and the seeder gone."""
    clock = Clock()
    swarm = MemorySwarm(clock)
    ps = _prompt_set()
    manifest = seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, ps, "tiny", operator, ttl_s=TTL)
    return swarm, clock, ps, manifest


def _keeper(swarm, ps, owner, name="node", budget=1 << 20, seed=0, **kw) -> PromptSetKeeper:
    return PromptSetKeeper(MemoryTransport(swarm, name), SWARM, ps.id, owner, ttl_s=TTL, budget_bytes=budget,
                           rng=random.Random(seed), check_interval_s=1.0, **kw)


def _run(clock, keepers, seconds: float, step: float = 1.0, every=None) -> None:
    end = clock.t + seconds
    while clock.t < end:
        clock.t += step
        for k in keepers:
            k.tick()
        if every is not None:
            every()


def _loads(swarm, ps, owner) -> bool:
    try:
        return load_prompt_set(MemoryTransport(swarm, "late"), SWARM, ps.id, owner, timeout=1) == ps
    except PromptSetError:
        return False


def test_without_a_keeper_the_set_lapses_one_ttl_after_the_seeder_stops(seeded, operator) -> None:
    swarm, clock, ps, _ = seeded
    assert _loads(swarm, ps, operator.public_key)
    clock.t += TTL + 1
    assert not _loads(swarm, ps, operator.public_key)


def test_a_node_re_stores_the_set_before_it_expires(seeded, operator) -> None:
    swarm, clock, ps, manifest = seeded
    keeper = _keeper(swarm, ps, operator.public_key)
    gaps: list[float] = []

    def check() -> None:  # at every second: the set is loadable by a node joining now
        if int(clock.t) % 25 == 0:
            gaps.append(0.0 if _loads(swarm, ps, operator.public_key) else 1.0)

    _run(clock, [keeper], 10 * TTL, every=check)
    assert len(gaps) >= 39 and sum(gaps) == 0  # loadable throughout ten lifetimes of the seeder's records
    assert 9 <= keeper.restores <= 16  # about once per TTL (at 2/3 to 11/12 of each lifetime)
    entries = swarm.get_owned(keys.prompt_manifest_key(SWARM, ps.id))
    assert entries["node"].value == codec.encode(manifest)  # the operator's signed bytes, unchanged
    assert "seeder" not in entries  # the seeder's own copy lapsed long ago
    metrics = keeper.step_metrics()
    assert metrics["prompt_set_restores"] == keeper.restores
    assert metrics["prompt_set_restored_bytes"] == keeper.restored_bytes > 0
    assert keeper.step_metrics()["prompt_set_restores"] == 0  # per call, not cumulative


def test_restore_times_are_spread_over_the_last_third(seeded, operator) -> None:
    swarm, clock, ps, _ = seeded
    t0, expiration = clock.t, clock.t + TTL
    keepers = [_keeper(swarm, ps, operator.public_key, name=f"n{i}", seed=i) for i in range(200)]
    for k in keepers:
        k.tick()
    dues = [k.due - t0 for k in keepers]
    assert min(dues) >= TTL * 2 / 3 and max(dues) <= TTL * 5 / 6  # the last third's first half (whole-set holders)
    assert max(dues) - min(dues) > 0.9 * TTL / 6  # spread over (nearly) the whole window
    assert abs(statistics.mean(dues) - TTL * (2 / 3 + 1 / 12)) < 1.5  # uniform within it
    assert restore_time(t0, expiration, 0.0) == pytest.approx(t0 + TTL * 2 / 3)
    assert restore_time(t0, expiration, 0.999, partial=True) == pytest.approx(t0 + TTL * 11 / 12, abs=0.1)
    # The first node due re-stores; the others see the later expiration and only draw again.
    _run(clock, keepers, 5 * TTL)
    restores = sum(k.restores for k in keepers)
    assert 5 <= restores <= 10
    assert sum(k.skipped for k in keepers) > 150
    assert _loads(swarm, ps, operator.public_key)


def test_the_byte_budget_bounds_what_a_node_holds_and_re_stores(operator, monkeypatch) -> None:
    monkeypatch.setattr(prompts, "MAX_CHUNK_BYTES", 200)  # many small chunks
    clock = Clock()
    swarm = MemorySwarm(clock)
    ps = _prompt_set(120)
    manifest = seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, ps, "tiny", operator, ttl_s=TTL)
    chunk_sizes = {d: len(swarm.get_blob(d)) for d in manifest.chunk_digests}
    manifest_size = len(codec.encode(manifest))
    total = manifest_size + sum(chunk_sizes.values())
    budget = manifest_size + sum(chunk_sizes.values()) // 3
    keepers = [_keeper(swarm, ps, operator.public_key, name=f"n{i}", budget=budget, seed=i) for i in range(12)]
    alive: list[bool] = []
    _run(clock, keepers, 5 * TTL, every=lambda: alive.append(_loads(swarm, ps, operator.public_key))
         if int(clock.t) % 20 == 0 else None)
    covered = set().union(*(k.chunks for k in keepers))
    assert covered == set(manifest.chunk_digests)  # together the nodes hold every chunk...
    assert len(alive) >= 24 and all(alive)  # ...and keep the set loadable, though none can hold it all
    for k in keepers:
        assert k.partial and k.restores >= 4  # each part re-stored in every lifetime
        held = len(k.manifest.item.value) + sum(map(len, k.chunks.values()))
        assert held <= budget < total
        assert k.restored_bytes <= k.restores * budget  # each re-store within the budget
        assert 0 < len(k.chunks) < len(manifest.chunk_digests)
    assert len({frozenset(k.chunks) for k in keepers}) > 1  # nodes cover different parts of the set
    # A node whose budget cannot hold even the manifest re-stores nothing.
    tiny = _keeper(swarm, ps, operator.public_key, name="tiny", budget=manifest_size - 1)
    _run(clock, [tiny], 2 * TTL)
    assert tiny.restores == 0 and tiny.restored_bytes == 0


def test_whole_set_and_part_holders_together_keep_every_chunk(operator, monkeypatch) -> None:
    monkeypatch.setattr(prompts, "MAX_CHUNK_BYTES", 200)
    clock = Clock()
    swarm = MemorySwarm(clock)
    ps = _prompt_set(120)
    manifest = seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, ps, "tiny", operator, ttl_s=TTL)
    part = len(codec.encode(manifest)) + sum(len(swarm.get_blob(d)) for d in manifest.chunk_digests) // 8
    whole = [_keeper(swarm, ps, operator.public_key, name=f"w{i}", seed=i) for i in range(3)]
    parts = [_keeper(swarm, ps, operator.public_key, name=f"p{i}", budget=part, seed=10 + i) for i in range(4)]
    _run(clock, whole + parts, 8 * TTL)
    # Part-holders extend the manifest in the later window, so whole-set holders never skip after one:
    # every lifetime has one whole-set re-store, and every chunk stays alive.
    assert 7 <= sum(k.restores for k in whole) <= 12
    assert all(swarm.get_blob(d) is not None for d in manifest.chunk_digests)
    assert _loads(swarm, ps, operator.public_key)


def test_a_record_that_fails_verification_is_never_re_stored(seeded, operator, stranger) -> None:
    swarm, clock, ps, manifest = seeded
    key = keys.prompt_manifest_key(SWARM, ps.id)
    # The only copies: the operator's manifest with a changed field (bad signature), and a copy
    # signed by another key (wrong owner).
    swarm.write_raw_owned(key, "seeder", codec.encode(dataclasses.replace(manifest, name="evil")), clock.t + TTL)
    seed_prompt_set(MemoryTransport(swarm, "mallory"), SWARM, ps, "tiny", stranger, ttl_s=TTL)
    keeper = _keeper(swarm, ps, operator.public_key)
    _run(clock, [keeper], 3 * TTL)
    assert keeper.restores == 0 and keeper.manifest is None
    assert keeper.transport.traffic["bytes_out"] == 0
    assert "node" not in swarm.get_owned(key)
    assert keeper.take_drops() == {"bad_signature": 1, "wrong_owner": 1}  # counted once, though read often


def test_a_chunk_that_fails_its_digest_is_not_re_stored(seeded, operator, monkeypatch) -> None:
    swarm, clock, ps, manifest = seeded
    bad = manifest.chunk_digests[0]
    swarm.corrupt_blob(bad)
    keeper = _keeper(swarm, ps, operator.public_key)
    _run(clock, [keeper], 2 * TTL)
    assert keeper.restores >= 1
    assert bad not in keeper.chunks and set(keeper.chunks) == set(manifest.chunk_digests) - {bad}
    assert keeper.take_drops()["chunk_hash_mismatch"] >= 1
    assert swarm.get_blob(bad) is None  # lapsed: nobody re-stored the corrupted bytes


def test_a_verified_tombstone_stops_re_storing_and_the_set_lapses(seeded, operator, caplog) -> None:
    swarm, clock, ps, manifest = seeded
    keepers = [_keeper(swarm, ps, operator.public_key, name=f"n{i}", seed=i) for i in range(5)]
    _run(clock, keepers, 2 * TTL)
    assert _loads(swarm, ps, operator.public_key)
    restores = sum(k.restores for k in keepers)
    end_prompt_set(MemoryTransport(swarm, "operator-node"), SWARM, ps.id, operator, successor="arithmetic-next",
                   ttl_s=36 * TTL)
    with caplog.at_level(logging.INFO, logger="swarm_node.swarm.prompt_keeper"):
        _run(clock, keepers, 3 * TTL)
    assert all(k.ended is not None for k in keepers)
    assert sum(k.restores for k in keepers) <= restores + len(keepers)  # at most one already under way
    ended_lines = [r for r in caplog.records if "ended by its operator" in r.getMessage()]
    assert len(ended_lines) == len(keepers)  # each node says so once
    for d in manifest.chunk_digests:
        assert swarm.get_blob(d) is None  # nobody re-stored: the chunks lapsed
    entries = swarm.get_owned(keys.prompt_manifest_key(SWARM, ps.id))
    assert all(isinstance(codec.decode(v.value), prompts.PromptSetTombstone) for v in entries.values())
    with pytest.raises(PromptSetEnded, match="arithmetic-next"):
        load_prompt_set(MemoryTransport(swarm, "late"), SWARM, ps.id, operator.public_key, timeout=1)


def test_a_set_seeded_again_after_its_tombstone_lives_again(seeded, operator) -> None:
    swarm, clock, ps, _ = seeded
    old = _keeper(swarm, ps, operator.public_key, name="old")
    _run(clock, [old], TTL / 2)
    end_prompt_set(MemoryTransport(swarm, "op"), SWARM, ps.id, operator, ttl_s=20 * TTL)
    _run(clock, [old], TTL)
    assert old.ended is not None and not _loads(swarm, ps, operator.public_key)
    old_restores = old.restores
    # The operator seeds the set again: a manifest newer than the tombstone, which (kept alive by
    # anyone replaying it) does not end it.
    clock.t += 1.0
    seed_prompt_set(MemoryTransport(swarm, "seeder2"), SWARM, ps, "tiny", operator, ttl_s=TTL)
    assert _loads(swarm, ps, operator.public_key)
    new = _keeper(swarm, ps, operator.public_key, name="new")
    _run(clock, [old, new], 4 * TTL)
    assert new.ended is None and new.restores >= 3 and _loads(swarm, ps, operator.public_key)
    assert old.restores == old_restores  # a node that saw the end stays stopped


def test_a_forged_tombstone_is_ignored_and_counted(seeded, operator, stranger) -> None:
    swarm, clock, ps, _ = seeded
    key = keys.prompt_manifest_key(SWARM, ps.id)
    keeper = _keeper(swarm, ps, operator.public_key)
    _run(clock, [keeper], TTL / 2)
    # A stranger's tombstone (valid signature, another key) and the operator's with a changed field.
    end_prompt_set(MemoryTransport(swarm, "mallory"), SWARM, ps.id, stranger, ttl_s=20 * TTL)
    real = end_prompt_set(MemoryTransport(swarm, "scratch"), SWARM, ps.id, operator, ttl_s=1.0)
    clock.t += 2.0  # the real one lapses; only its altered copy stays
    swarm.write_raw_owned(key, "eve", codec.encode(dataclasses.replace(real, successor="evil-set")),
                          clock.t + 20 * TTL)
    restores = keeper.restores
    _run(clock, [keeper], 5 * TTL)
    assert keeper.ended is None and keeper.restores >= restores + 4
    assert keeper.take_drops() == {"tombstone_wrong_owner": 1, "tombstone_bad_signature": 1}
    assert _loads(swarm, ps, operator.public_key)


def test_without_an_operator_key_the_tombstone_must_come_from_the_manifest_key(seeded, operator, stranger) -> None:
    swarm, clock, ps, _ = seeded
    keeper = _keeper(swarm, ps, None)
    _run(clock, [keeper], TTL / 2)
    assert keeper.owner == operator.public_key  # pinned from the verified manifest
    end_prompt_set(MemoryTransport(swarm, "mallory"), SWARM, ps.id, stranger, ttl_s=20 * TTL)
    _run(clock, [keeper], 2 * TTL)
    assert keeper.ended is None and _loads(swarm, ps, None)
    end_prompt_set(MemoryTransport(swarm, "op"), SWARM, ps.id, operator, ttl_s=20 * TTL)
    _run(clock, [keeper], TTL)
    assert keeper.ended is not None


def test_a_late_read_is_retried_and_a_lapsed_set_is_revived(seeded, operator) -> None:
    swarm, clock, ps, _ = seeded
    keeper = _keeper(swarm, ps, operator.public_key)
    keeper.tick()  # first sight
    real_get_all = keeper.transport.get_all
    keeper.transport.get_all = lambda key, timeout: {}  # every read comes back empty (late)
    clock.t = keeper.due
    keeper.tick()
    assert keeper.restores == 0 and keeper.due == clock.t + keeper.check_interval_s  # retried soon, nothing stored
    clock.t += TTL  # the seeder's records lapse meanwhile
    assert not _loads(swarm, ps, operator.public_key)
    keeper.transport.get_all = real_get_all
    keeper.tick()  # this node still holds the verified records: it stores them again
    assert keeper.restores == 1 and _loads(swarm, ps, operator.public_key)


def test_a_failure_in_the_keeper_thread_surfaces_in_the_step_loop(seeded, operator) -> None:
    swarm, _, ps, _ = seeded
    keeper = _keeper(swarm, ps, operator.public_key)

    def broken() -> None:
        raise ValueError("a bug")

    keeper.tick = broken  # type: ignore[method-assign]
    keeper.check_interval_s = 0.01
    keeper.start()
    keeper._thread.join(5)
    with pytest.raises(RuntimeError, match="prompt-set keeper failed: a bug"):
        keeper.step_metrics()


def test_a_following_keeper_loads_the_successor_and_keeps_it_alive_once_the_node_takes_it(seeded, operator,
                                                                                        caplog) -> None:
    swarm, clock, ps, manifest = seeded
    successor = _prompt_set(40)
    seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, successor, "next", operator, ttl_s=TTL)
    taken: list = []
    keeper = _keeper(swarm, ps, operator.public_key, follow=True, on_successor=taken.append)
    assert keeper.watch_interval_s == pytest.approx(TTL / 3)
    _run(clock, [keeper], TTL / 2)
    assert keeper.step_metrics()["prompt_set_switches"] == 0 and keeper.successor is None
    end_prompt_set(MemoryTransport(swarm, "op"), SWARM, ps.id, operator, successor=successor.id, ttl_s=36 * TTL)
    with caplog.at_level(logging.INFO, logger="swarm_node.swarm.prompt_keeper"):
        _run(clock, [keeper], keeper.watch_interval_s + 1)  # a watch read sees the end, the next tick loads
    assert keeper.ended is not None and keeper.successor is not None
    assert keeper.successor.prompt_set == successor and keeper.successor.ended == (ps.id,)
    assert [r.getMessage() for r in caplog.records] == [
        f"prompt set {ps.id} was ended by its operator: this node no longer re-stores it and follows its "
        f"successor {successor.id}"]
    assert taken == []  # the node takes it between steps, through step_metrics
    metrics = keeper.step_metrics()
    assert metrics["prompt_set_switches"] == 1 and [f.prompt_set for f in taken] == [successor]
    assert keeper.prompt_set_id == successor.id and keeper.ended is None and keeper.successor is None
    assert keeper.step_metrics()["prompt_set_switches"] == 0  # per call
    # From now on the keeper keeps the successor alive, as it kept the ended set, after its seeder left.
    restores = keeper.restores
    _run(clock, [keeper], 4 * TTL)
    assert keeper.restores >= restores + 3 and _loads(swarm, successor, operator.public_key)
    assert all(swarm.get_blob(d) is None for d in manifest.chunk_digests)  # the ended set lapsed


def test_a_watch_only_keeper_sees_the_end_within_its_watch_interval(seeded, operator) -> None:
    swarm, clock, ps, _ = seeded
    successor = _prompt_set(40)
    seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, successor, "next", operator, ttl_s=20 * TTL)
    keeper = _keeper(swarm, ps, operator.public_key, budget=0, follow=True, watch_interval_s=10.0)
    assert keeper._wants_thread()  # budget 0 re-stores nothing but still watches
    _run(clock, [keeper], 15.0)
    end_prompt_set(MemoryTransport(swarm, "op"), SWARM, ps.id, operator, successor=successor.id, ttl_s=36 * TTL)
    _run(clock, [keeper], 11.0)
    assert keeper.successor is not None and keeper.successor.prompt_set == successor
    assert keeper.restores == 0 and keeper.transport.traffic["bytes_out"] == 0
    assert keeper.step_metrics()["prompt_set_switches"] == 0  # no node took it (no on_successor): it waits
    assert keeper.successor is not None and keeper.prompt_set_id == ps.id


def test_a_missing_successor_is_tried_again_and_an_end_leading_nowhere_is_final(seeded, operator, caplog) -> None:
    swarm, clock, ps, _ = seeded
    successor, last = _prompt_set(40), _prompt_set(30)
    keeper = _keeper(swarm, ps, operator.public_key, follow=True, on_successor=lambda followed: None)
    _run(clock, [keeper], 5.0)
    end_prompt_set(MemoryTransport(swarm, "op"), SWARM, ps.id, operator, successor=successor.id, ttl_s=36 * TTL)
    with caplog.at_level(logging.WARNING, logger="swarm_node.swarm.prompt_keeper"):
        _run(clock, [keeper], 3 * keeper.watch_interval_s)
    assert keeper.ended is not None and keeper.successor is None and keeper._tick_once()
    warned = [r.getMessage() for r in caplog.records if "tries again" in r.getMessage()]
    assert len(warned) == 1 and f"the successor of ended prompt set {ps.id}" in warned[0]  # warned once
    seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, successor, "next", operator, ttl_s=TTL)
    _run(clock, [keeper], keeper.watch_interval_s + 1)
    assert keeper.successor is not None and keeper.successor.prompt_set == successor
    assert keeper.step_metrics()["prompt_set_switches"] == 1 and keeper.prompt_set_id == successor.id
    # The successor ends too, and its successor was ended without one: the node stays where it is.
    seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, last, "last", operator, ttl_s=TTL)
    end_prompt_set(MemoryTransport(swarm, "op"), SWARM, last.id, operator, ttl_s=36 * TTL)
    end_prompt_set(MemoryTransport(swarm, "op"), SWARM, successor.id, operator, successor=last.id, ttl_s=36 * TTL)
    _run(clock, [keeper], keeper.watch_interval_s + 2)
    assert keeper.ended is not None and keeper.successor is None
    assert keeper.follow_failed is not None and f"followed from {successor.id}" in keeper.follow_failed
    assert not keeper._tick_once()  # the thread ends
    assert keeper.step_metrics()["prompt_set_switches"] == 0 and keeper.prompt_set_id == successor.id


def test_only_a_keeper_with_the_operator_key_follows(seeded) -> None:
    swarm, _, ps, _ = seeded
    with pytest.raises(ValueError, match="needs the operator key"):
        _keeper(swarm, ps, None, follow=True)


def test_a_tombstone_naming_no_valid_successor_is_not_followed(seeded, operator) -> None:
    swarm, clock, ps, _ = seeded
    keeper = _keeper(swarm, ps, operator.public_key, follow=True, on_successor=lambda followed: None)
    _run(clock, [keeper], 5.0)
    # Signed by the operator (end_prompt_set itself refuses such a name): a bad name must not crash anyone.
    tombstone = prompts.PromptSetTombstone(prompt_set_id=ps.id, owner_public_key=operator.public_key,
                                           ended_at=clock.t, successor="not a set id!")
    tombstone = dataclasses.replace(tombstone,
                                    signature=operator.private_key.sign(codec.tombstone_signing_bytes(tombstone)))
    MemoryTransport(swarm, "op").store_owned(keys.prompt_manifest_key(SWARM, ps.id), codec.encode(tombstone),
                                             clock.t + 36 * TTL, 1.0)
    _run(clock, [keeper], keeper.watch_interval_s + 2)
    assert keeper.ended is not None and keeper.successor is None and "no valid successor" in keeper.follow_failed
    assert not keeper._tick_once() and keeper.step_metrics()["prompt_set_switches"] == 0
    with pytest.raises(PromptSetEnded, match="naming no valid successor"):
        prompts.load_followed(MemoryTransport(swarm, "late"), SWARM, ps.id, operator.public_key, timeout=1)
