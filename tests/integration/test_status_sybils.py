"""The status shards against a Sybil flood, through a real DHT whose replicas keep at most
`SHARD_CAP` records under a key: 50 honest nodes' status records (with receipts, so the largest
records under their shards) are stored, each in its owner's shard, more records in all than one
shard holds; then 256 minimal records from fresh identities are sent to every replica by the red-team
attacker's raw store RPCs, enough to fill every shard. Every honest record must stay readable and
each honest node's re-store must be accepted: a replica keeps the records it already holds
(`storage.CappedStorage`: a full status shard refuses newcomers, it never evicts an incumbent for a
smaller one, and no identity holds more than its record cap). Records piled into another peer's
shard are refused by the replicas (`keys.status_shard`)."""

from __future__ import annotations

import time

import pytest

from protocol import codec, keys
from protocol.messages import NodeStatus, Receipt
from protocol.validate import ValidationLimits
from swarm_node.swarm.statuses import read_statuses
from swarm_node.swarm.transport import DropCounter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
SWARM = "itest-status-sybils"
HONEST, SYBILS = 50, 256
SHARD_CAP = 12  # records a replica keeps under one status shard: 50 honest records need several shards


def _fast_keys(n: int) -> None:
    """Fill the attacker's key pool with `n` 1024-bit RSA keys (a quarter of the time of hivemind's
    2048-bit ones; the DHT's signature check takes any RSA key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from hivemind.utils.crypto import RSAPrivateKey

    from tests.integration import redteam_attacker

    for _ in range(n):
        der = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())
        key = RSAPrivateKey.__new__(RSAPrivateKey)
        key.__setstate__({"_private_key": der})
        redteam_attacker._KEY_POOL.append(key)


def _honest_record(peer: str, now: float, step: int, senders: list[str]) -> NodeStatus:
    """A node's record as a node writes it: ~100 metrics and receipts for the peers it took groups from."""
    return NodeStatus(peer_id=peer, role="trainer", model_id="HuggingFaceTB/SmolLM2-135M-Instruct", step=step,
                      timestamp=now, maddrs=("/ip4/10.0.0.1/tcp/31337/p2p/" + peer,),
                      metrics={f"metric_{i:03d}": 0.5 + i for i in range(100)}, tokenizer_fingerprint="ab" * 32,
                      receipts_span_s=600.0,
                      receipts=tuple(Receipt(sender=s, taken=4, samples=32, gradient=12, filtered=8,
                                             filtered_advantage=6, filtered_kl=3, dropped=(("stale", 2),))
                                     for s in senders if s != peer)[:12])


def _sybil_record(peer: str, now: float) -> NodeStatus:
    return NodeStatus(peer_id=peer, role="trainer", model_id="s", step=0, timestamp=now)


def _readable(reader, honest_ids: set[str]) -> tuple[dict[str, NodeStatus], DropCounter]:
    drops = DropCounter()
    found = read_statuses(reader, SWARM, ValidationLimits(vocab_size=1), drops, timeout=20.0)
    return {s.peer_id: s for s in found if s.peer_id in honest_ids}, drops


def test_256_sybil_status_records_leave_every_honest_record_readable(dht_factory) -> None:
    from hivemind.utils import get_dht_time

    from tests.integration.redteam_attacker import Attacker, Identity

    caps = (SHARD_CAP, 256 << 10, 256 << 10)
    a = dht_factory(SWARM, storage_caps=caps)
    b = dht_factory(SWARM, initial_peers=a.visible_maddrs, storage_caps=caps)
    attacker = Attacker(a.visible_maddrs)
    try:
        _fast_keys(HONEST + SYBILS)
        honest = [Identity() for _ in range(HONEST)]
        sybils = [Identity() for _ in range(SYBILS)]
        honest_ids = {i.peer_id for i in honest}
        deadline = time.monotonic() + 30
        while len(attacker.dht.run_coroutine(_routing_peers)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)

        def store(idents, make, step: int = 1) -> list[int]:
            now = get_dht_time()
            return attacker.store([attacker.owned(i, keys.status_key(SWARM, keys.status_shard(i.peer_id)),
                                                  codec.encode(make(i, now, step)), now + 120) for i in idents])

        senders = [i.peer_id for i in honest]
        honest_record = lambda i, now, step: _honest_record(i.peer_id, now, step, senders)  # noqa: E731
        sizes = [len(codec.encode(honest_record(i, 0.0, 1))) for i in honest[:1]]
        sybil_size = len(codec.encode(_sybil_record(sybils[0].peer_id, 0.0)))
        assert sizes[0] > 10 * sybil_size  # the honest records are by far the largest under their shards
        shards = [keys.status_shard(i.peer_id) for i in honest]
        assert max(shards.count(s) for s in set(shards)) < SHARD_CAP < HONEST
        assert min(store(honest, honest_record)) == 2  # both replicas keep every honest record
        assert len(_readable(a, honest_ids)[0]) == HONEST  # more than one shard holds: all read back

        # Records piled into the first honest node's shard: only those that belong there are taken.
        now, target = get_dht_time(), shards[0]
        piled = attacker.store([attacker.owned(i, keys.status_key(SWARM, target),
                                               codec.encode(_sybil_record(i.peer_id, now)), now + 120)
                                for i in sybils[:32]])
        belong = [keys.status_shard(i.peer_id) == target for i in sybils[:32]]
        assert [n > 0 for n, ok in zip(piled, belong) if not ok] == [False] * belong.count(False)
        assert a.dht_refusals().get("bad_owned_record", 0) >= belong.count(False)

        accepted = store(sybils, lambda i, now, step: _sybil_record(i.peer_id, now))
        readable, drops = _readable(a, honest_ids)
        refusals = a.dht_refusals()
        print(f"PROBE honest readable after {SYBILS} Sybil records: {len(readable)}/{HONEST}; "
              f"Sybil records accepted by a replica: {sum(n > 0 for n in accepted)}; refusals: {refusals}")
        assert len(readable) == HONEST, f"{HONEST - len(readable)} honest records lost to the flood"
        assert refusals.get("key_full", 0) >= 1 and refusals.get("evicted_for_smaller", 0) == 0

        # Each honest node re-stores its record (a later step): every replica takes it.
        again = store(honest, honest_record, step=2)
        readable, _ = _readable(b, honest_ids)
        assert min(again) == 2 and len(readable) == HONEST and {s.step for s in readable.values()} == {2}
    finally:
        attacker.dht.shutdown()


async def _routing_peers(_dht, node) -> list:
    return list(node.protocol.routing_table.uid_to_peer_id.values())


EVIL_MODEL = "\x1b[2J\x1b[Hpwned\u202etxt.exe\nforged line"  # clears the screen, reverses text, forges a line


def test_status_given_prints_a_peers_escape_sequence_inert(dht_factory) -> None:
    """`swarm-node status --given PEER` (the command, in its own process, over the DHT) shows a
    receiver whose model id is an escape sequence: inert, and what a receipt proves."""
    import subprocess
    import sys

    swarm = "itest-status-inert"
    node = dht_factory(swarm)
    target = "12D3KooWQwertyPeerAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    st = NodeStatus(peer_id=node.peer_id, role="trainer", model_id=EVIL_MODEL, step=3, timestamp=node.dht_time(),
                    receipts_span_s=60.0, receipts=(Receipt(sender=target, taken=2, samples=8, gradient=3, filtered=1,
                                                            filtered_advantage=1, filtered_kl=0),))
    key = keys.status_key(swarm, keys.status_shard(node.peer_id))
    assert node.store_owned(key, codec.encode(st), node.dht_time() + 120)
    res = subprocess.run([sys.executable, "-m", "swarm_node", "status", "--given", target, "--initial-peer",
                          node.visible_maddrs[0], "--swarm-id", swarm, "--timeout", "15"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    assert "\x1b" not in out and "\u202e" not in out and not any(ln.startswith("forged") for ln in out.splitlines())
    flat = "".join(out.split())
    assert "\\x1b[2J\\x1b[Hpwned" in flat and node.peer_id[:14] in out  # shown as text (the view cuts it at 20)
    assert "identitiesarefree" in flat
