"""The hivemind DHT process behind HivemindTransport, with fixes for running it in production.

* `PipeFixedDHT` applies, in the DHT process as it starts, the patches of hivemind this project
  makes (`patches.py`, which says what each replaces and why): the command pipe's blocking
  `recv()` (a hivemind 1.1.12 bug with large messages), PeerID's lazy base58 encoding, and the
  capped storage. It also shuts the DHT down when the parent process dies (kill -9), so a
  restarted node can reuse its identity without an orphan daemon answering for it.
  The p2p daemon it starts gets SIGKILL from the kernel if the DHT process itself dies (prctl
  PR_SET_PDEATHSIG), so no daemon outlives its DHT even on kill -9 of the whole tree.
* `get_many_in_dht` / `store_many_in_dht` run inside the DHT process: one traversal per batch of
  keys, each bounded by its own timeout.
* `health_in_dht` / `redial_in_dht` serve self-healing membership (swarm/membership.py): the
  routing table and live connections, and re-dialling known peers after an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

import hivemind
from hivemind.p2p import P2PDaemonError, PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm_node.util.lifecycle import daemons_die_with_this_process
from swarm_node.swarm import patches
from swarm_node.swarm.addresses import check_initial_peers
from swarm_node.swarm.transport import SwarmConnectError

logger = logging.getLogger(__name__)

__all__ = ["PipeFixedDHT", "check_initial_peers", "get_many_in_dht", "health_in_dht", "ping_clocks_in_dht", "redial_in_dht",
           "store_many_in_dht"]

class PipeFixedDHT(hivemind.DHT):
    """hivemind.DHT with this project's patches applied in its process (`patches.py`) and a
    parent-death watchdog (see module doc)."""

    parent_check_interval = 1.0
    storage_caps: tuple | None = None  # CappedStorage.install's arguments (subkeys, bytes per key and peer, ...)

    def run(self) -> None:
        patches.lazy_peer_id_base58()
        daemons_die_with_this_process()
        if self.storage_caps is not None:
            from swarm_node.swarm.storage import CappedStorage

            CappedStorage.install(*self.storage_caps)
        patches.blocking_recv_pipe(self)
        threading.Thread(target=self._watch_parent, args=(os.getppid(),), daemon=True).start()
        super().run()

    collected_calls = 0  # calls whose pending task the garbage collector took (see _drop_collected_calls)

    async def _run_coroutine(self, coro: Any, future: Any) -> None:
        """hivemind's, for a caller that stopped waiting: `HivemindTransport._call` cancels its
        future after its timeout, and hivemind then fails to set the late result on it with an
        InvalidStateError traceback in the node's log for every slow DHT call (two per call, on a
        loaded machine dozens a minute). A late result or error is dropped here instead; an error
        for a caller still waiting is logged and handed to it as before."""
        from concurrent.futures import InvalidStateError

        self._drop_collected_calls(asyncio.get_running_loop())
        try:
            result = await coro(self, self._node)
        except BaseException as e:
            if not future.done():
                if isinstance(e, Exception):  # not the DHT process's own cancellation or exit
                    logger.exception("Caught an exception when running a coroutine:")
                with contextlib.suppress(InvalidStateError):
                    future.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        with contextlib.suppress(InvalidStateError):  # cancelled meanwhile: nobody waits for it
            future.set_result(result)

    def _drop_collected_calls(self, loop: asyncio.AbstractEventLoop) -> None:
        """Count, rather than log as an error, a call's task the garbage collector took while pending.

        hivemind starts each call's task and keeps no reference to it; a task whose awaited future
        nothing else references any more (an answer that will never come) is collected, and asyncio
        then logs "Task was destroyed but it is pending!" at ERROR. Found by the soak: up to 35 such
        lines an hour in a node's log at load 31. Such a call cannot finish, and its caller's own
        timeout has ended or will end it (`HivemindTransport._call`); it is counted in
        `collected_calls` (`health_in_dht`). Every other loop error goes to the default handler."""
        if getattr(self, "_collected_handler_loop", None) is loop:
            return

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            task = context.get("task")
            coro = getattr(task, "get_coro", lambda: None)()
            if (str(context.get("message", "")).startswith("Task was destroyed but it is pending")
                    and getattr(coro, "__qualname__", "").endswith("._run_coroutine")):
                type(self).collected_calls += 1
                return
            loop.default_exception_handler(context)

        loop.set_exception_handler(handler)
        self._collected_handler_loop = loop

    def _watch_parent(self, parent_pid: int) -> None:
        stop = threading.Event()
        while not stop.wait(self.parent_check_interval):
            if os.getppid() != parent_pid:
                # The parent is gone (killed): ask our own event loop to shut down cleanly, which
                # also stops the p2p daemon, then make sure the process ends.
                self._outer_pipe.send(("_shutdown", [], {}))
                stop.wait(self.shutdown_timeout + 2)
                os._exit(0)


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
    from swarm_node.swarm.storage import CappedStorage

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


async def health_in_dht(_dht: Any, node: Any) -> dict[str, Any]:
    """Runs in the DHT process: routing table size and the peers with a live connection."""
    table = node.protocol.routing_table
    connected = await node.p2p.list_peers()
    peers = {info.peer_id.to_base58(): [str(a) for a in info.addrs] for info in connected}
    for peer_id in list(table.peer_id_to_uid):
        peers.setdefault(peer_id.to_base58(), [])
    return {"routing_table_size": len(table.uid_to_peer_id), "live_peers": len(connected),
            "peers": peers, "stored_keys": len(node.protocol.storage),
            "collected_calls": PipeFixedDHT.collected_calls}


async def ping_clocks_in_dht(_dht: Any, node: Any, peers: list[tuple[str, list[str]]],
                             timeout: float) -> list[tuple[str, float, float, float]]:
    """Runs in the DHT process: connect to and ping each (peer id, multiaddrs); per answer (peer id,
    sent, the peer's DHT time, received) in this process's DHT time (hivemind's ping carries it)."""
    from hivemind.proto import dht_pb2
    from hivemind.utils.timed_storage import get_dht_time

    async def one(peer_b58: str, addrs: list[str]) -> tuple[str, float, float, float] | None:
        peer = PeerID.from_base58(peer_b58)
        if peer == node.peer_id:
            return None
        if addrs:
            try:
                await node.p2p._client.connect(peer, [Multiaddr(a) for a in addrs])
            except Exception:  # network boundary: the daemon may still reach it through its peerstore
                pass
        request = dht_pb2.PingRequest(peer=node.protocol.node_info, validate=False)
        sent = get_dht_time()
        response = await node.protocol.get_stub(peer).rpc_ping(request, timeout=timeout)
        received = get_dht_time()
        return (peer_b58, sent, float(response.dht_time), received) if response.dht_time else None

    tasks = [asyncio.create_task(one(p, a)) for p, a in peers]
    done, pending = await asyncio.wait(tasks, timeout=timeout) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    return [t.result() for t in done if not t.cancelled() and t.exception() is None and t.result() is not None]


async def redial_in_dht(_dht: Any, node: Any, peers: list[tuple[str, list[str]]], timeout: float) -> int:
    """Runs in the DHT process: connect to each (peer id, multiaddrs), ping it into the routing table,
    forget its blacklist entry, then look up our own id to refill the table. Returns peers that answered."""

    async def one(peer_b58: str, addrs: list[str]) -> bool:
        peer = PeerID.from_base58(peer_b58)
        if peer == node.peer_id:
            return False
        try:
            await node.p2p._client.connect(peer, [Multiaddr(a) for a in addrs])
        except Exception:  # network boundary: a peer still unreachable is the normal case here
            pass  # the daemon may still reach it through addresses in its peerstore
        if await node.protocol.call_ping(peer) is None:
            return False
        node.blacklist.register_success(peer)
        return True

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    tasks = [asyncio.create_task(one(p, a)) for p, a in peers]
    done, pending = await asyncio.wait(tasks, timeout=timeout) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    answered = sum(1 for t in done if not t.cancelled() and t.exception() is None and t.result())
    if answered and loop.time() < deadline:  # refill the table from the peers that answered
        try:
            await asyncio.wait_for(node.find_nearest_nodes([node.node_id]), deadline - loop.time())
        except asyncio.TimeoutError:
            pass
    return answered


def start_dht(kwargs: dict[str, Any], timeout: float, attempts: int,
              storage_caps: tuple | None) -> PipeFixedDHT:
    """Start the DHT process with `kwargs` (PipeFixedDHT's), trying `attempts` times within
    `timeout` each; raises SwarmConnectError naming the initial peers when none answered."""
    errors = []
    for attempt in range(1, max(1, attempts) + 1):
        dht = PipeFixedDHT(start=False, **kwargs)
        dht.storage_caps = storage_caps
        dht.run_in_background(await_ready=False)
        try:
            dht.wait_until_ready(timeout=timeout)
            return dht
        except FutureTimeoutError:
            errors.append(f"attempt {attempt}: no answer within {timeout:.0f}s")
        except (P2PDaemonError, RuntimeError, OSError, ValueError) as e:  # bootstrap / daemon errors
            errors.append(f"attempt {attempt}: {e}")
        except Exception as e:  # hivemind's ValidationError: an initial peer's clock (or reachability)
            dht.shutdown()
            if "local time must be within" in str(e):
                from swarm_node.swarm.clock import bootstrap_refusal

                raise bootstrap_refusal(str(e), kwargs.get("initial_peers") or []) from e
            if "can't access this node" in str(e):
                from swarm_node.util.errors import RuntimeFailure

                raise RuntimeFailure(
                    f"the initial peers cannot dial back to this node (behind NAT or a firewall): {e}",
                    "set swarm.client_mode = true, or swarm.use_auto_relay = true with a public "
                    "`swarm-node bootstrap` as initial peer, or forward the port (swarm.announce_maddrs)") from e
            raise
        dht.shutdown()
    peers = kwargs.get("initial_peers") or []
    if peers:
        raise SwarmConnectError(f"could not reach any initial peer: {', '.join(peers)} ({'; '.join(errors)})")
    raise SwarmConnectError(f"the DHT failed to start: {'; '.join(errors)}")
