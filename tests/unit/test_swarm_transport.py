"""MemoryTransport semantics (the fake every node-loop test relies on) and identity files."""

from __future__ import annotations

import os
import stat

import pytest

from swarm_node.util.errors import InputError
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.transport import MAX_BLOB_BYTES, MAX_RECORD_BYTES, blob_digest
from tests.fakes import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def swarm(clock: Clock) -> MemorySwarm:
    return MemorySwarm(clock=clock)


def test_owned_records_are_per_owner_and_expire(swarm: MemorySwarm, clock: Clock) -> None:
    a, b = MemoryTransport(swarm, "A"), MemoryTransport(swarm, "B")
    assert a.store_owned("k", b"a1", clock.t + 10)
    assert b.store_owned("k", b"b1", clock.t + 20)
    assert a.store_owned("k", b"a2", clock.t + 15)  # replaces only A's own value
    got = b.get_all("k", timeout=1)
    assert {o: v.value for o, v in got.items()} == {"A": b"a2", "B": b"b1"}
    assert got["A"].expiration_time == clock.t + 15
    clock.t += 16
    assert {o: v.value for o, v in a.get_all("k", timeout=1).items()} == {"B": b"b1"}
    clock.t += 10
    assert a.get_all("k", timeout=1) == {}


def test_older_expiration_does_not_replace_newer(swarm: MemorySwarm, clock: Clock) -> None:
    a = MemoryTransport(swarm, "A")
    assert a.store_owned("k", b"new", clock.t + 100)
    assert not a.store_owned("k", b"old", clock.t + 50)
    assert a.get_all("k", 1)["A"].value == b"new"


def test_forged_subkey_is_rejected(swarm: MemorySwarm, clock: Clock) -> None:
    honest = MemoryTransport(swarm, "honest")
    honest.store_owned("k", b"mine", clock.t + 10)
    assert not swarm.forge_owned("k", "honest", b"forged", clock.t + 99, signer="mallory")
    assert swarm.rejected_forgeries == 1
    assert honest.get_all("k", 1)["honest"].value == b"mine"


def test_store_argument_checks(swarm: MemorySwarm, clock: Clock) -> None:
    a = MemoryTransport(swarm, "A")
    with pytest.raises(ValueError, match="MAX_RECORD_BYTES"):
        a.store_owned("k", b"x" * (MAX_RECORD_BYTES + 1), clock.t + 1)
    with pytest.raises(ValueError, match="not after"):
        a.store_owned("k", b"x", clock.t)
    with pytest.raises(ValueError, match="split it"):
        a.put_blob(b"x" * (MAX_BLOB_BYTES + 1), clock.t + 1)


def test_blobs_are_content_addressed_and_hash_checked(swarm: MemorySwarm, clock: Clock) -> None:
    a, b = MemoryTransport(swarm, "A"), MemoryTransport(swarm, "B")
    data = os.urandom(1000)
    digest = a.put_blob(data, clock.t + 10)
    assert digest == blob_digest(data)
    assert b.get_blob(digest, timeout=1) == data
    swarm.corrupt_blob(digest)
    fetch = b.get_blobs([digest], timeout=1)
    assert fetch.found == {} and fetch.failed == {digest: "hash_mismatch"}
    assert b.drops["hash_mismatch"] == 1
    big = "f" * 64
    swarm.write_raw_blob(big, b"y" * (MAX_BLOB_BYTES + 1), clock.t + 10)
    assert b.get_blobs([big], 1).failed == {big: "oversized"}
    missing = "0" * 64
    swarm.unreachable.add(digest)
    fetch = b.get_blobs([digest, missing], 1)
    assert fetch.failed == {digest: "fetch_timeout", missing: "missing"}
    assert b.traffic["bytes_in"] > 0 and a.traffic["bytes_out"] == 1000


def test_blob_expires(swarm: MemorySwarm, clock: Clock) -> None:
    a = MemoryTransport(swarm, "A")
    digest = a.put_blob(b"abc", clock.t + 5)
    clock.t += 6
    assert a.get_blob(digest, 1) is None


def test_shutdown_is_idempotent_and_final(swarm: MemorySwarm, clock: Clock) -> None:
    a = MemoryTransport(swarm, "A")
    a.shutdown()
    a.shutdown()
    with pytest.raises(RuntimeError):
        a.get_all("k", 1)


def test_identity_persists_with_private_mode(tmp_path) -> None:
    from hivemind.p2p import PeerID

    from swarm_node.swarm.identity import IDENTITY_FILENAME, load_node_identity, owner_id

    first = load_node_identity(tmp_path / "node")
    path = tmp_path / "node" / IDENTITY_FILENAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_node_identity(tmp_path / "node")
    assert again.peer_id == first.peer_id and again.public_key == first.public_key
    # The owner id derived from the public key is the libp2p peer id the daemon will use.
    assert PeerID.from_identity(path.read_bytes()).to_base58() == first.peer_id
    assert owner_id(first.public_key.decode()) == first.peer_id
    other = load_node_identity(tmp_path / "other")
    assert other.peer_id != first.peer_id
    assert not list((tmp_path / "node").glob("*.tmp"))


def test_identity_refuses_world_readable_key(tmp_path) -> None:
    from swarm_node.swarm.identity import load_or_create_key

    ident = load_or_create_key(tmp_path / "op.key")
    os.chmod(ident.path, 0o644)
    with pytest.raises(InputError, match="chmod 600"):
        load_or_create_key(tmp_path / "op.key")


def test_owner_id_rejects_garbage() -> None:
    from swarm_node.swarm.identity import owner_id

    with pytest.raises(ValueError):
        owner_id(b"ssh-rsa not-a-key")
