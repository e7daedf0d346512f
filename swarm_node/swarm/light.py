"""A read-only DHT client without torch: what a one-shot `swarm-node status` reads through.

`import hivemind` imports torch, about 3.5 s of a status read's 4.5 s on a quiet 2-core machine;
the DHT itself does not need it. `LightObserver` loads hivemind's DHT without torch
(`patches.load_light_hivemind`: what that replaces and why is said there) and runs a client-mode
`DHTNode` on an event loop in a thread of this process (no DHT process, no fork); it checks
records with the same validators as a node (signatures, owned subkeys, sizes) and implements the
reading half of `Transport`. While hivemind is loaded this way `hivemind.DHT` does not exist in
the process until a name only the real package has completes the import, so only a one-shot
`status` uses it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from protocol import keys
from swarm_node.swarm.patches import load_light_hivemind
from swarm_node.swarm.transport import BlobFetch, OwnedValue, SwarmConnectError, Transport


class LightObserver(Transport):
    """A client-mode DHT peer in this process that reads owned records (status records)."""

    def __init__(self, initial_peers: Sequence[str], swarm_id: str, *, timeout: float = 20.0,
                 wait_timeout: float = 3.0) -> None:
        load_light_hivemind()
        from hivemind.dht.node import DHTNode
        from hivemind.dht.validation import CompositeValidator
        from hivemind.utils.crypto import RSAPrivateKey

        from swarm_node.util.lifecycle import daemons_die_with_this_process
        from swarm_node.swarm.addresses import check_initial_peers
        from swarm_node.swarm.validators import CachedRSASignatureValidator, SwarmRecordValidator

        self.swarm_id = keys.check_name(swarm_id)
        daemons_die_with_this_process()  # the p2p daemon goes with this process, however it ends
        self._key = RSAPrivateKey()
        validator = CompositeValidator([CachedRSASignatureValidator(self._key), SwarmRecordValidator(swarm_id)])
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="light-dht", daemon=True)
        self._thread.start()
        self._node = None
        peers = check_initial_peers(initial_peers)
        try:
            self._node = self._run(DHTNode.create(initial_peers=peers, client_mode=True, record_validator=validator,
                                                  wait_timeout=wait_timeout, bootstrap_timeout=timeout,
                                                  cache_locally=False, cache_on_store=False), timeout + 5.0)
        except BaseException as e:
            self.shutdown()
            if isinstance(e, (TimeoutError, OSError, RuntimeError)) or type(e).__name__ == "P2PDaemonError":
                raise SwarmConnectError(f"could not reach any initial peer: {', '.join(peers)} "
                                        f"({type(e).__name__}: {e})") from e
            raise

    def _run(self, coro: Any, timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    @property
    def peer_id(self) -> str:
        return self._node.peer_id.to_base58() if self._node is not None else ""

    @property
    def public_key(self) -> bytes:
        return self._key.get_public_key().to_bytes()

    def dht_time(self) -> float:
        from hivemind.utils.timed_storage import get_dht_time

        return get_dht_time()

    def get_all_many(self, keys_: Sequence[str], timeout: float) -> dict[str, dict[str, OwnedValue]]:
        from swarm_node.swarm.validators import owned_values

        wanted = list(dict.fromkeys(keys_))

        async def read() -> dict[str, Any]:
            futures = await self._node.get_many(wanted, sufficient_expiration_time=float("inf"), return_futures=True)
            done, pending = await asyncio.wait(list(futures.values()), timeout=timeout)
            for fut in pending:
                fut.cancel()
            return {k: f.result() for k, f in futures.items() if f in done and not f.cancelled()
                    and f.exception() is None}

        found = self._run(read(), timeout + 2.0) if wanted else {}
        now = self.dht_time()
        return {k: owned_values(found.get(k), now) for k in wanted}

    def store_owned(self, key: str, value: bytes, expiration_time: float, timeout: float = 10.0) -> bool:
        raise NotImplementedError("a LightObserver only reads")

    def put_blob(self, data: bytes, expiration_time: float, timeout: float = 10.0) -> str:
        raise NotImplementedError("a LightObserver only reads")

    def get_blobs(self, digests: Sequence[str], timeout: float) -> BlobFetch:
        raise NotImplementedError("a LightObserver only reads")

    def shutdown(self) -> None:
        if self._node is not None:
            node, self._node = self._node, None
            try:
                self._run(node.shutdown(), 10.0)
            except (TimeoutError, RuntimeError, OSError):
                pass  # the p2p daemon is a child of this process and goes with it
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
