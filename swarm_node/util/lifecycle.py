"""Process lifecycle: signals from the first instant, a parent-death watch, and the node-dir lock.

Signals. `install_signal_handlers()` runs before anything else in every command (cli.common.run_cli).
Until a command registers a graceful stop with `on_stop(callback)`, SIGINT or SIGTERM raises
`Interrupted` in the main thread, so a Ctrl-C while a model loads ends the process at once (and,
should a library swallow the exception, a backstop ends it `STOP_GRACE_S` later). After
`on_stop`, a signal calls the callback instead (the node finishes its step, checkpoints and leaves).
Either way the signal is remembered: `received_signal()` tells callers that a signal arrived even
if a library swallowed the exception, and the process exits 128 + signal (130 for SIGINT, 143 for
SIGTERM).

Parent-death watch. `swarm-node local` starts its nodes with SWARM_NODE_PARENT_PID set; a node
whose parent disappears (killed with -9) sends itself SIGTERM, so it checkpoints and leaves
instead of training on with nobody to stop it.

Node-dir lock. `NodeDirLock(node_dir)` holds an exclusive `flock` on `node_dir/.lock` for the
life of the process and writes its pid there; a second process on the same directory is refused
with the holder's pid. The kernel drops the lock when the process dies, so a killed node never
leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from swarm_node.util.errors import RuntimeFailure

log = logging.getLogger(__name__)

PARENT_ENV = "SWARM_NODE_PARENT_PID"
LOCK_FILE = ".lock"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_GRACE_S = 10.0  # a process stopped during startup ends within this, even if a library swallowed it


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by SIGINT/SIGTERM before a graceful stop is registered. A
    KeyboardInterrupt, so event loops and libraries let it through as they do Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class _State:
    received: int | None = None
    on_stop: Callable[[int], None] | None = None
    fork_hook = False
    backstop_cancel: threading.Event | None = None


def _handle(signum: int, _frame: Any) -> None:
    first = _State.received is None
    if first:
        _State.received = signum
    callback = _State.on_stop
    if callback is not None:
        callback(signum)
        return
    if first:
        _exit_later(signum)
    raise Interrupted(signum)


def _exit_later(signum: int) -> None:
    """A backstop for `Interrupted` swallowed by library code (an event loop's callback handler):
    if the process is still alive `STOP_GRACE_S` later, it exits with 128 + signal."""

    cancel = _State.backstop_cancel = threading.Event()

    def backstop() -> None:
        if cancel.wait(STOP_GRACE_S):
            return
        print(f"swarm-node: stopped by {signal.Signals(signum).name} (startup did not unwind within "
              f"{STOP_GRACE_S:.0f}s)", file=sys.stderr, flush=True)
        os._exit(exit_code_for(signum))

    threading.Thread(target=backstop, name="stop-backstop", daemon=True).start()


def install_signal_handlers() -> None:
    """SIGINT/SIGTERM: remembered, and raised as `Interrupted` until `on_stop` registers a callback.
    Forked children (the DHT process, the reward worker) get Python's default handling back."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _SIGNALS:
        signal.signal(sig, _handle)
    if not _State.fork_hook:
        os.register_at_fork(after_in_child=_default_handlers_in_child)
        _State.fork_hook = True
        previous_hook = sys.excepthook

        def excepthook(kind: type, value: BaseException, tb: Any) -> None:
            signum = _State.received
            if signum is not None and issubclass(kind, KeyboardInterrupt):  # stopped while importing
                print(f"swarm-node: stopped by {signal_name(signum)}", file=sys.stderr, flush=True)
                sys.stdout.flush()
                os._exit(exit_code_for(signum))
            previous_hook(kind, value, tb)

        sys.excepthook = excepthook


def _default_handlers_in_child() -> None:
    if signal.getsignal(signal.SIGINT) is _handle:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is _handle:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _State.received = None
    _State.on_stop = None


def on_stop(callback: Callable[[int], None] | None) -> None:
    """From now on a signal calls `callback(signum)` instead of raising (None: raise again)."""
    _State.on_stop = callback


def received_signal() -> int | None:
    """The first SIGINT/SIGTERM this process received, if any."""
    return _State.received


def reset() -> None:
    """Forget received signals, callbacks and a pending backstop (tests run several commands in one process)."""
    _State.received = None
    _State.on_stop = None
    if _State.backstop_cancel is not None:
        _State.backstop_cancel.set()
        _State.backstop_cancel = None


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def exit_code_for(signum: int) -> int:
    return 128 + int(signum)


def start_torch_shm_manager() -> None:
    """Start torch's shared-memory manager now, with SIGINT/SIGTERM blocked in this thread.

    hivemind shares tensors through torch's `file_system` strategy, whose first use starts the
    `torch_shm_manager` helper; a signal handled while torch waits for the helper's reply makes
    that wait spin forever (libshm retries the failed read's stale result on EINTR), so a Ctrl-C
    at that instant would hang the process. Blocked here, the signal is handled right after."""
    import torch.multiprocessing

    if torch.multiprocessing.get_sharing_strategy() != "file_system":
        return
    if threading.current_thread() is not threading.main_thread():
        torch.zeros(1).share_memory_()
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        torch.zeros(1).share_memory_()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def watch_parent(parent_pid: int, interval_s: float = 1.0) -> threading.Thread:
    """A daemon thread that sends this process SIGTERM once `parent_pid` is no longer its parent."""

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(interval_s):
            if os.getppid() != parent_pid:
                log.warning("parent process %d is gone: stopping (finish the step, checkpoint, leave)", parent_pid)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def stop_processes(procs: list[subprocess.Popen], timeout_s: float) -> list[int]:
    """SIGTERM to every child still running (each stops as on Ctrl-C), wait up to `timeout_s` in all,
    then SIGKILL the rest. Returns the indices of the children that had to be killed."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    killed = []
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            killed.append(i)
    return killed


def watch_parent_from_env() -> threading.Thread | None:
    """Start `watch_parent` when SWARM_NODE_PARENT_PID names this process's parent. The variable is
    removed from this process's environment: its own children (a grid worker's `swarm-node local`)
    are not watching that process."""
    raw = os.environ.pop(PARENT_ENV, "")
    if not raw.isdigit():
        return None
    pid = int(raw)
    if os.getppid() != pid:  # already orphaned before we looked
        os.kill(os.getpid(), signal.SIGTERM)
    return watch_parent(pid)


class NodeDirLock:
    """An exclusive lock on a node directory, held until `release()` or process exit."""

    def __init__(self, node_dir: Path) -> None:
        self.path = Path(node_dir) / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> NodeDirLock:
        f = open(self.path, "a+")  # noqa: SIM115  (held for the life of the process)
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise RuntimeFailure(
                f"node directory {self.path.parent} is in use by process {holder} (lock {self.path})",
                "stop that process first, or pass another --node-dir") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> NodeDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


_PR_SET_PDEATHSIG = 1


def daemons_die_with_this_process() -> None:
    """Every subprocess this process starts through asyncio (hivemind's p2pd) gets SIGKILL from the
    kernel when this process dies (prctl PR_SET_PDEATHSIG, set between fork and exec)."""
    import asyncio.subprocess
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    original = asyncio.subprocess.create_subprocess_exec
    if getattr(original, "_dies_with_parent", False):
        return

    async def create_subprocess_exec(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("preexec_fn", die_with_parent)
        return await original(*args, **kwargs)

    create_subprocess_exec._dies_with_parent = True  # type: ignore[attr-defined]
    asyncio.subprocess.create_subprocess_exec = create_subprocess_exec
