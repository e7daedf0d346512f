"""Every change this project makes to hivemind's own code (hivemind 1.1.12), in one place: what each
patch replaces, why, and who applies it.

Nothing is patched on import, and this module imports no hivemind at its top: each patch is a
function its user calls where the patch is needed (the DHT process as it starts, the one-shot
`status` reader), so a process that never calls one runs hivemind unchanged.

1. `load_light_hivemind` / `finish_light_hivemind` replace the *import* of hivemind's packages.
   Why: `import hivemind` imports torch (its package `__init__` pulls in averaging and MoE code,
   and `hivemind.DHT` passes results between processes as shared torch tensors): about 3.5 s of a
   one-shot `swarm-node status` read's 4.5 s on a quiet 2-core machine, though the DHT itself
   (`hivemind.dht.node.DHTNode`, `hivemind.p2p`) needs only torch-free parts of `hivemind.utils`.
   `load_light_hivemind` makes `hivemind`, `hivemind.utils` and `hivemind.dht` plain namespaces
   (their `__init__` files skipped; `hivemind.utils` gets the names of its torch-free
   submodules), so those submodules load in about 0.1 s. The first use of a name only the real
   package has (`hivemind.DHT`, `from hivemind import ...`) runs the skipped `__init__` files in
   the same module objects (`finish_light_hivemind`): a process that goes on after a light read
   (a test run) still gets all of hivemind, and what it loaded before stays valid.
   User: `swarm.light.LightObserver` (the one-shot `status`).
2. `lazy_peer_id_base58` replaces `hivemind.p2p.PeerID.__init__` and `PeerID.to_base58`: the
   base58 form is encoded on first use instead of in `__init__`. Why: the DHT builds a PeerID
   for every neighbour listed in every find response and rarely prints one; the eager encoding
   was the largest single cost (~14% of CPU) of a busy DHT process. Same values, same methods.
   User: the DHT process (`swarm.dht_process.PipeFixedDHT.run`), inside that process only.
3. `blocking_recv_pipe` replaces `hivemind.DHT._inner_pipe`, the DHT process's end of its command
   pipe, by a wrapper whose `recv()` first puts the descriptor back in blocking mode. Why: the DHT
   process registers the pipe with uvloop, which makes the descriptor non-blocking, so `recv()` of
   a message larger than the pipe buffer (any large value passed to `store`) fails with
   `BlockingIOError` and then `EOFError` (a hivemind 1.1.12 bug). User: the DHT process.
4. `install_storage` replaces `hivemind.dht.protocol.DHTLocalStorage`, the class hivemind's DHT
   protocol builds its storage from (by that module-level name), with a subclass
   (`swarm.storage.CappedStorage`: caps on subkeys and bytes per key and per peer). Why: the
   protocol offers no parameter for the storage class. User: the DHT process, before its protocol
   is created.

Private hivemind names read but not replaced (they would break first on an upgrade):
`DHT._outer_pipe` (the parent watchdog's shutdown request, `dht_process`), `P2P._client.connect`
(dialling a peer at known addresses before a ping: `dht_process`),
`CompositeValidator._validators` (reading the refusal counts: `dht_process`), and
`SchemaValidator._key_id_to_field_name` (set by `validators.ScheduledKeySchemaValidator`, the schema's
keys as a function of DHT time).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import hivemind
    from hivemind.dht.storage import DHTLocalStorage

# Submodules of hivemind.utils that do not import torch, whose public names `hivemind.utils` has
# to offer (`from hivemind.utils import get_logger` etc. in hivemind.dht and hivemind.p2p).
_TORCH_FREE_UTILS = ("asyncio", "logging", "nested", "performance_ema", "serializer", "timed_storage")


# ---- 1. hivemind's DHT without torch --------------------------------------------------------------

def load_light_hivemind() -> bool:
    """Make hivemind's DHT importable without torch (patch 1); False (nothing done) when hivemind is
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
        if spec is None:
            raise ImportError(f"{name} has no {path}/__init__.py")
        module = importlib.util.module_from_spec(spec)
        setattr(module, "_swarm_node_light", True)
        setattr(module, "__getattr__", partial(_complete, name))  # a name only the real package has: finish it
        sys.modules[name] = module
        return module

    hivemind = namespace("hivemind", root)
    utils = namespace("hivemind.utils", f"{root}/utils")
    setattr(hivemind, "utils", utils)
    setattr(hivemind, "dht", namespace("hivemind.dht", f"{root}/dht"))
    for sub in _TORCH_FREE_UTILS:
        module = importlib.import_module(f"hivemind.utils.{sub}")
        for name in getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]:
            setattr(utils, name, getattr(module, name))
    return True


def finish_light_hivemind() -> None:
    """Run the `__init__` files `load_light_hivemind` skipped, in the same module objects: hivemind
    is then the real package (torch imported), and everything loaded before stays valid (the
    same classes). Happens by itself on the first name only the real package has."""
    for name in ("hivemind.utils", "hivemind.dht", "hivemind"):
        module = sys.modules.get(name)
        if module is not None and module.__dict__.pop("_swarm_node_light", False):
            module.__dict__.pop("__getattr__", None)
            spec = module.__spec__
            if spec is None or spec.loader is None:
                raise ImportError(f"{name} cannot be completed: it has no loader")
            spec.loader.exec_module(module)


def _complete(name: str, attr: str) -> Any:
    submodule = sys.modules.get(f"{name}.{attr}")
    if submodule is not None:  # `import hivemind.p2p.x as y` while hivemind.p2p is being imported
        return submodule
    if attr.startswith("__") or not getattr(sys.modules.get(name), "_swarm_node_light", False):
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")
    finish_light_hivemind()
    return getattr(sys.modules[name], attr)


# ---- 2. PeerID's base58 form on first use -----------------------------------------------------------

def lazy_peer_id_base58() -> None:
    """Make hivemind's PeerID encode its base58 form on first use instead of in `__init__` (patch 2)."""
    import base58
    from hivemind.p2p import PeerID

    def __init__(self: PeerID, peer_id_bytes: bytes) -> None:
        self._bytes = peer_id_bytes
        self._b58_str = None

    def to_base58(self: PeerID) -> str:
        if self._b58_str is None:
            self._b58_str = base58.b58encode(self._bytes).decode()
        return self._b58_str

    PeerID.__init__ = __init__
    PeerID.to_base58 = to_base58


# ---- 3. the DHT process's command pipe ----------------------------------------------------------------

class BlockingRecvPipe:
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


def blocking_recv_pipe(dht: hivemind.DHT) -> None:
    """Wrap the DHT process's end of its command pipe (patch 3); call in the DHT process's `run`."""
    dht._inner_pipe = BlockingRecvPipe(dht._inner_pipe)


# ---- 4. the DHT's storage class -----------------------------------------------------------------------

def install_storage(storage: type[DHTLocalStorage]) -> None:
    """Make every DHT protocol created from now on in this process store into `storage` (patch 4)."""
    import hivemind.dht.protocol as protocol_module

    protocol_module.DHTLocalStorage = storage
