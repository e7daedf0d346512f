"""A read-only DHT client without torch: what a one-shot `swarm-node status` reads through.

`import hivemind` imports torch, about 3.5 s of a status read's 4.5 s on a quiet 2-core machine;
the DHT itself does not need it. `LightObserver` loads hivemind's DHT without torch
(`patches.load_light_hivemind`: what that replaces and why is said there) and runs a client-mode
`DHTNode` on an event loop in a thread of this process (no DHT process, no fork); it checks
records with the same validators as a node (signatures, owned subkeys, sizes) and implements the
reading half of `Transport`. While hivemind is loaded this way `hivemind.DHT` does not exist in
the process until a name only the real package has completes the import, so only a one-shot
`status` uses it.

`shutdown` (also on a failed connect) ends everything it started on its loop before it closes the
loop: an event loop left open is closed by its finaliser at interpreter exit, and when it shares a
reference cycle with its own self-pipe sockets (it does after a failed connect: the exit of the
dropped p2p daemon waits in its queue of callbacks) the sockets' finalisers may run first, and
`BaseEventLoop.__del__` prints an `Exception ignored ... Invalid file descriptor: -1` traceback
after the command's one error line.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from protocol import keys
from swarm_node.swarm.patches import load_light_hivemind
from swarm_node.swarm.transport import BlobFetch, OwnedValue, SwarmConnectError, Transport


class _ClientLoop(asyncio.SelectorEventLoop):
    """The reader's event loop. It keeps the subprocesses started on it (hivemind's p2p daemon), so
    that `drain` can end one that hivemind dropped: `P2P.create` raises without shutting down a
    daemon that failed to start, and the daemon's exit, which the child watcher queues on this
    loop, is lost when the loop stops before running it."""

    EXIT_GRACE = 0.5  # seconds a child has to exit by itself before drain kills it

    def __init__(self) -> None:
        super().__init__()
        self._children: list[asyncio.SubprocessTransport] = []

    async def subprocess_exec(self, *args: Any, **kwargs: Any) -> Any:
        transport, protocol = await super().subprocess_exec(*args, **kwargs)
        self._children.append(transport)
        return transport, protocol

    async def drain(self, timeout: float) -> None:
        """In a task on this loop, before it stops: cancel the other tasks; wait for the children's
        exits to reach this loop (a daemon that failed to start is exiting by itself), SIGKILL to
        one still running after `EXIT_GRACE` seconds (not sooner: `kill` first polls, and a poll
        that reaps a child before the child watcher does makes asyncio log "Unknown child
        process"); close their transports; shut down async generators and the default executor.
        Bounded by `timeout` (seconds) in all."""
        deadline = self.time() + timeout
        others = [task for task in asyncio.all_tasks(self) if task is not asyncio.current_task(self)]
        for task in others:
            task.cancel()
        with suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), timeout)
        if not await self._children_exited(min(self.EXIT_GRACE, deadline - self.time())):
            for child in self._children:
                if child.get_returncode() is None:
                    with suppress(ProcessLookupError):
                        child.kill()
            await self._children_exited(deadline - self.time())
        for child in self._children:
            child.close()
        await self.shutdown_asyncgens()
        with suppress(TimeoutError):
            await asyncio.wait_for(self.shutdown_default_executor(), max(deadline - self.time(), 0.1))

    async def _children_exited(self, timeout: float) -> bool:
        """Whether every child's exit has reached this loop (the child watcher's thread hands it
        over) within `timeout` seconds."""
        deadline = self.time() + timeout
        while any(child.get_returncode() is None for child in self._children):
            if self.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True


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
        peers = check_initial_peers(initial_peers)
        daemons_die_with_this_process()  # the p2p daemon goes with this process, however it ends
        self._key = RSAPrivateKey()
        validator = CompositeValidator([CachedRSASignatureValidator(self._key), SwarmRecordValidator(swarm_id)])
        self._loop = _ClientLoop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="light-dht", daemon=True)
        self._thread.start()
        self._node = None
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
        """On the loop, the node and its p2p daemon, then what is left there (`_ClientLoop.drain`);
        then stop the loop, join its thread and close the loop. Bounded; a second call does nothing."""
        if self._loop.is_closed():
            return
        node, self._node = self._node, None
        try:
            if self._thread.is_alive():
                self._run(self._close_on_loop(node), 20.0)
        except (TimeoutError, RuntimeError, OSError):
            pass  # the p2p daemon is a child of this process and goes with it
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            if not self._thread.is_alive():
                self._loop.close()

    async def _close_on_loop(self, node: Any) -> None:
        try:
            if node is not None:
                await asyncio.wait_for(node.shutdown(), 10.0)
        finally:
            await self._loop.drain(5.0)
