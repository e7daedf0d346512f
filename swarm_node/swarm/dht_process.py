"""The hivemind DHT process behind HivemindTransport, with fixes for running it in production.

* `PipeFixedDHT` works around a hivemind 1.1.12 bug: the DHT process registers its command pipe
  with uvloop, which makes the descriptor non-blocking, so `recv()` of a message larger than the
  pipe buffer (any large value passed to `store`) fails with `BlockingIOError` and then `EOFError`.
  Its `run()` wraps the pipe so every `recv()` first sets the descriptor back to blocking. It also
  shuts the DHT down when the parent process dies (kill -9), so a restarted node can reuse its
  identity without an orphan daemon answering for it, and makes hivemind's PeerID encode base58
  lazily (the eager encoding was the largest single CPU cost of a busy DHT process).
* `get_many_in_dht` / `store_many_in_dht` run inside the DHT process: one traversal per batch of
  keys, each bounded by its own timeout.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from typing import Any

import base58
import hivemind
from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr
from hivemind.utils.multiaddr import exceptions as maddr_errors

__all__ = ["PipeFixedDHT", "check_initial_peers", "get_many_in_dht", "store_many_in_dht"]


class _BlockingRecvPipe:
    """A multiprocessing Connection whose recv() first puts the descriptor back in blocking mode."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def fileno(self) -> int:
        return self._conn.fileno()

    def poll(self, timeout: float = 0.0) -> bool:
        return self._conn.poll(timeout)

    def recv(self) -> Any:
        os.set_blocking(self._conn.fileno(), True)
        return self._conn.recv()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _lazy_peer_id_base58() -> None:
    """Make hivemind's PeerID encode its base58 form on first use instead of in `__init__`.

    The DHT builds a PeerID for every neighbour listed in every find response and rarely prints
    one; the eager base58 encoding was the largest single cost (~14% of CPU) of a busy DHT
    process. Same values, same methods; applied inside the DHT process only.
    """

    def __init__(self: PeerID, peer_id_bytes: bytes) -> None:
        self._bytes = peer_id_bytes
        self._b58_str = None

    def to_base58(self: PeerID) -> str:
        if self._b58_str is None:
            self._b58_str = base58.b58encode(self._bytes).decode()
        return self._b58_str

    PeerID.__init__ = __init__
    PeerID.to_base58 = to_base58


class PipeFixedDHT(hivemind.DHT):
    """hivemind.DHT with the large-message pipe fix, a parent-death watchdog and lazy peer-id
    encoding (see module doc)."""

    parent_check_interval = 1.0
    storage_caps: tuple[int, int, int] | None = None  # (subkeys per key, bytes per key, bytes per peer)

    def run(self) -> None:
        _lazy_peer_id_base58()
        if self.storage_caps is not None:
            from swarm_node.swarm.validators import CappedStorage

            CappedStorage.install(*self.storage_caps)
        self._inner_pipe = _BlockingRecvPipe(self._inner_pipe)
        threading.Thread(target=self._watch_parent, args=(os.getppid(),), daemon=True).start()
        super().run()

    def _watch_parent(self, parent_pid: int) -> None:
        stop = threading.Event()
        while not stop.wait(self.parent_check_interval):
            if os.getppid() != parent_pid:
                # The parent is gone (killed): ask our own event loop to shut down cleanly, which
                # also stops the p2p daemon, then make sure the process ends.
                self._outer_pipe.send(("_shutdown", [], {}))
                stop.wait(self.shutdown_timeout + 2)
                os._exit(0)


def check_initial_peers(initial_peers: Sequence[str]) -> list[str]:
    """Each initial peer must be a full multiaddr ending in /p2p/<peer id>; raise ValueError otherwise."""
    out = []
    for addr in initial_peers:
        try:
            maddr = Multiaddr(addr)
            maddr["p2p"]
        except (maddr_errors.Error, ValueError, TypeError) as e:
            raise ValueError(f"initial peer {addr!r} is not a multiaddr with /p2p/<peer id>: {e}") from e
        out.append(str(maddr))
    return out


async def get_many_in_dht(_dht: Any, node: Any, keys: list[str], latest: bool, timeout: float) -> dict[str, Any]:
    """Runs in the DHT process: one traversal for all keys; returns those found or missing in time."""
    futures = await node.get_many(keys, sufficient_expiration_time=float("inf") if latest else None,
                                  return_futures=True)
    done, pending = await asyncio.wait(list(futures.values()), timeout=timeout)
    for fut in pending:
        fut.cancel()
    return {k: f.result() for k, f in futures.items() if f in done and not f.cancelled() and f.exception() is None}


async def refusals_in_dht(_dht: Any, node: Any) -> dict[str, int]:
    """Runs in the DHT process: records refused so far by reason (validators and storage caps)."""
    from swarm_node.swarm.validators import CappedStorage

    counts: dict[str, int] = {}
    sources = [getattr(v, "refusals", None) for v in getattr(node.protocol.record_validator, "_validators", ())]
    for log in [*sources, CappedStorage.refusals]:
        for reason, n in (log.counts.items() if log is not None else ()):
            counts[reason] = counts.get(reason, 0) + n
    return counts


async def store_many_in_dht(_dht: Any, node: Any, keys: list[str], values: list[bytes], expiration: float,
                             subkeys: list[bytes | None], timeout: float) -> dict[Any, bool]:
    """Runs in the DHT process: one traversal storing every (key, subkey, value); {} if out of time."""
    try:
        return await asyncio.wait_for(node.store_many(keys, values, expiration, subkeys=subkeys), timeout)
    except asyncio.TimeoutError:
        return {}
