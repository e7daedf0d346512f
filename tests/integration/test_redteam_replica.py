"""A hostile replica: a plain hivemind DHT (no swarm validators) in the swarm answers reads of an
index key with garbage next to the honest record; honest readers drop that replica's answer and
still read the honest record from the other replicas, and honest replicas refuse the garbage."""

from __future__ import annotations

import time
from functools import partial

import pytest

from protocol import codec, keys
from protocol.messages import RolloutIndex

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
SWARM = "itest-replica"


def test_reader_tolerates_a_garbage_replica(dht_factory, tmp_path) -> None:
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.utils import get_dht_time
    from hivemind.utils.crypto import RSAPrivateKey

    from swarm_node.swarm.dht_process import PipeFixedDHT

    a = dht_factory(SWARM)
    b = dht_factory(SWARM, initial_peers=a.visible_maddrs)
    # The hostile replica signs its own records but checks nothing else: it keeps what it is sent.
    evil_key = RSAPrivateKey()
    evil = PipeFixedDHT(initial_peers=a.visible_maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True,
                        record_validators=[RSASignatureValidator(evil_key)])
    try:
        window = keys.window_of(a.dht_time(), 30.0)
        key = keys.rollout_index_key(SWARM, window)
        honest = codec.encode(RolloutIndex(sender=a.peer_id, window=window, entries=()))
        assert a.store_owned(key, honest, a.dht_time() + 60)
        evil_subkey = RSASignatureValidator(evil_key).local_public_key
        # Garbage, far-future garbage and an oversized record under the same key (one subkey: each
        # store replaces the last one whose expiration it beats): the evil replica keeps them
        # locally; every honest replica refuses them.
        now = get_dht_time()
        for value, exp in ((b"\x00garbage", now + 60), (b"\x00ghost", now + 1e8), (b"x" * (100 << 10), now + 60)):
            evil.store(key, value, exp, subkey=evil_subkey)
        time.sleep(0.5)
        assert evil.run_coroutine(partial(_entries_under, key=key)) == 2  # a's record and its own garbage
        for reader in (a, b):
            got = reader.get_all(key, timeout=10)
            assert got.get(a.peer_id) is not None and got[a.peer_id].value == honest, got
            assert set(got) == {a.peer_id}  # the evil replica's entries never reach the reader
    finally:
        evil.shutdown()


async def _entries_under(_dht, node, key: str) -> int:
    """Runs in the evil DHT process: how many subkeys its own storage holds under `key`."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.storage import DictionaryDHTValue

    item = node.protocol.storage.get(DHTID.generate(source=key))
    return len(item.value) if item is not None and isinstance(item.value, DictionaryDHTValue) else 0
