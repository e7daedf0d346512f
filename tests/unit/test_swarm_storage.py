"""A replica's storage (swarm/storage.py): the status key keeps the records it holds against any
number of newcomers (no eviction for a smaller record), an owner's re-store keeps its standing, and
one identity holds a bounded number of records over all keys."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("hivemind")

from hivemind.dht.routing import DHTID  # noqa: E402

from swarm_node.swarm.storage import CappedStorage  # noqa: E402

STATUS = DHTID.generate(source="status")
INDEX = DHTID.generate(source="index")


@pytest.fixture()
def storage():
    names = ("max_subkeys_per_key", "max_bytes_per_key", "max_bytes_per_peer", "max_records_per_peer", "incumbent_keys")
    saved = {n: getattr(CappedStorage, n) for n in names}
    CappedStorage.max_subkeys_per_key, CappedStorage.max_bytes_per_key = 4, 1000
    CappedStorage.max_bytes_per_peer, CappedStorage.max_records_per_peer = 700, 3
    CappedStorage.incumbent_keys = frozenset({STATUS.to_bytes()})
    CappedStorage.refusals.counts.clear()
    yield CappedStorage()
    for n, v in saved.items():
        setattr(CappedStorage, n, v)


def _held(storage, key=STATUS) -> set[bytes]:
    item = storage.get(key)
    return set(dict(item.value.items())) if item is not None else set()


def _owner(name: str) -> bytes:
    return f"[owner:{name}]".encode()


def test_a_status_key_full_of_honest_records_refuses_newcomers_however_small(storage) -> None:
    exp = time.time() + 60
    honest = [_owner(f"honest{i}") for i in range(3)]
    for sk in honest:
        assert storage.store_subkey(STATUS, sk, b"h" * 300, exp)  # 900 of 1000 bytes
    for i in range(50):  # a flood of minimal records from fresh identities
        storage.store_subkey(STATUS, _owner(f"sybil{i}"), b"s", exp)
    assert _held(storage) == {*honest, _owner("sybil0")}  # the free room only: 4 subkeys at most
    assert storage.refusals.counts["key_full"] == 49 and storage.refusals.counts["evicted_for_smaller"] == 0
    for sk in honest:  # every honest node re-stores its record, a little larger than before
        assert storage.store_subkey(STATUS, sk, b"H" * 320, exp + 1)
    assert _held(storage) >= set(honest)


def test_a_re_store_that_outgrows_the_key_evicts_the_newest_records_never_an_older_one(storage) -> None:
    exp = time.time() + 60
    assert storage.store_subkey(STATUS, _owner("old"), b"o" * 300, exp)
    time.sleep(0.01)
    assert storage.store_subkey(STATUS, _owner("mid"), b"m" * 300, exp)
    time.sleep(0.01)
    assert storage.store_subkey(STATUS, _owner("new"), b"n" * 300, exp)
    # "mid" grows: room is made by evicting "new" (held for less time), never "old"
    assert storage.store_subkey(STATUS, _owner("mid"), b"M" * 600, exp + 1)
    assert _held(storage) == {_owner("old"), _owner("mid")}
    assert storage.refusals.counts["evicted_for_incumbent"] == 1
    # "new" comes back: a newcomer again, into the room that is left (100 bytes)
    assert not storage.store_subkey(STATUS, _owner("new"), b"n" * 300, exp)
    assert storage.store_subkey(STATUS, _owner("new"), b"n" * 100, exp)
    # "new" cannot grow past the older records: it is refused, they stay
    assert not storage.store_subkey(STATUS, _owner("new"), b"N" * 200, exp + 1)
    assert _held(storage) == {_owner("old"), _owner("mid"), _owner("new")}


def test_a_lapsed_record_loses_its_standing(storage) -> None:
    now = time.time()
    assert storage.store_subkey(STATUS, _owner("gone"), b"g" * 300, now + 0.2)
    for i in range(3):
        assert storage.store_subkey(STATUS, _owner(f"n{i}"), b"x" * 200, now + 60)
    time.sleep(0.3)  # "gone" lapsed: its room is free for whoever stores first
    assert storage.store_subkey(STATUS, _owner("late"), b"l" * 300, now + 60)
    assert not storage.store_subkey(STATUS, _owner("gone"), b"g" * 300, now + 60)  # it comes back a newcomer


def test_other_keys_still_make_room_for_smaller_records(storage) -> None:
    exp = time.time() + 60
    assert storage.store_subkey(INDEX, _owner("big1"), b"x" * 450, exp)
    assert storage.store_subkey(INDEX, _owner("big2"), b"x" * 450, exp)
    assert storage.store_subkey(INDEX, _owner("small"), b"s" * 200, exp)
    assert _owner("small") in _held(storage, INDEX) and storage.refusals.counts["evicted_for_smaller"] == 1


def test_one_identity_holds_at_most_its_record_cap_over_all_keys(storage) -> None:
    exp = time.time() + 60
    for i in range(3):
        assert storage.store_subkey(DHTID.generate(source=f"k{i}"), _owner("one"), b"x" * 10, exp)
    assert not storage.store_subkey(DHTID.generate(source="k3"), _owner("one"), b"x" * 10, exp)
    assert storage.store_subkey(DHTID.generate(source="k0"), _owner("one"), b"y" * 10, exp + 1)  # its own: replaced
    assert storage.refusals.counts["records_per_peer"] == 1
