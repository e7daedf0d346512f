"""A read-only DHT client without torch: what a one-shot `swarm-node status` reads through.

`import hivemind` imports torch (its package `__init__` pulls in the averaging and MoE code, and
`hivemind.DHT` passes results between processes through `MPFuture`, which shares torch tensors):
about 3.5 s of a status read's 4.5 s on a quiet 2-core machine. The DHT itself does not need
torch: `hivemind.dht.node.DHTNode` and `hivemind.p2p` only use the torch-free parts of
`hivemind.utils`. `load_light_hivemind()` makes `hivemind`, `hivemind.utils` and `hivemind.dht`
importable as plain namespaces (their `__init__` files are skipped; `hivemind.utils` gets the
names of its torch-free submodules), so those submodules load in about 0.1 s.

The catch: while loaded this way, `hivemind.DHT` does not exist in the process, so only a
one-shot `status` uses it; the first use of a name only the real package has completes the
import (`finish_light_hivemind`), so a process that goes on (a test run) still gets all of it. `LightObserver` runs a client-mode `DHTNode` on an event loop in a thread of
this process (no DHT process, no fork); it checks records with the same validators as a node
(signatures, owned subkeys, sizes) and implements the reading half of `Transport`.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Sequence
from functools import partial
from typing import Any

from protocol import keys
from swarm_node.swarm.transport import BlobFetch, OwnedValue, SwarmConnectError, Transport

# Submodules of hivemind.utils that do not import torch, whose public names `hivemind.utils` has
# to offer (`from hivemind.utils import get_logger` etc. in hivemind.dht and hivemind.p2p).
_TORCH_FREE_UTILS = ("asyncio", "logging", "nested", "performance_ema", "serializer", "timed_storage")


def load_light_hivemind() -> bool:
    """Make hivemind's DHT importable without torch; False (nothing done) when hivemind is
    already imported in full."""
    if "hivemind" in sys.modules:
        return getattr(sys.modules["hivemind"], "_swarm_node_light", False)
    spec = importlib.util.find_spec("hivemind")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("hivemind is not installed")
    root = list(spec.submodule_search_locations)[0]

    def namespace(name: str, path: str) -> types.ModuleType:
        """The package's module object, its `__init__` not run (finish_light_hivemind runs it)."""
        spec = importlib.util.spec_from_file_location(name, f"{path}/__init__.py", submodule_search_locations=[path])
        module = importlib.util.module_from_spec(spec)
        module._swarm_node_light = True
        module.__getattr__ = partial(_complete, name)  # a name only the real package has: finish it
        sys.modules[name] = module
        return module

    hivemind = namespace("hivemind", root)
    utils = namespace("hivemind.utils", f"{root}/utils")
    hivemind.utils = utils
    hivemind.dht = namespace("hivemind.dht", f"{root}/dht")
    for sub in _TORCH_FREE_UTILS:
        module = importlib.import_module(f"hivemind.utils.{sub}")
        for name in getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]:
            setattr(utils, name, getattr(module, name))
    return True


def finish_light_hivemind() -> None:
    """Run the `__init__` files `load_light_hivemind` skipped, in the same module objects: hivemind
    is then the real package (torch imported), and everything loaded before stays valid (the
    same classes). Happens by itself on the first name only the real package has (`hivemind.DHT`,
    `from hivemind import ...`), so a process that goes on after a light read (a test run) can
    start full DHTs."""
    for name in ("hivemind.utils", "hivemind.dht", "hivemind"):
        module = sys.modules.get(name)
        if module is not None and module.__dict__.pop("_swarm_node_light", False):
            module.__dict__.pop("__getattr__", None)
            module.__spec__.loader.exec_module(module)


def _complete(name: str, attr: str) -> Any:
    submodule = sys.modules.get(f"{name}.{attr}")
    if submodule is not None:  # `import hivemind.p2p.x as y` while hivemind.p2p is being imported
        return submodule
    if attr.startswith("__") or not getattr(sys.modules.get(name), "_swarm_node_light", False):
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")
    finish_light_hivemind()
    return getattr(sys.modules[name], attr)


class LightObserver(Transport):
    """A client-mode DHT peer in this process that reads owned records (status records)."""

    def __init__(self, initial_peers: Sequence[str], swarm_id: str, *, timeout: float = 20.0,
                 wait_timeout: float = 3.0) -> None:
        load_light_hivemind()
        from hivemind.dht.node import DHTNode
        from hivemind.dht.validation import CompositeValidator
        from hivemind.utils.crypto import RSAPrivateKey

        from swarm_node.lifecycle import daemons_die_with_this_process
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
