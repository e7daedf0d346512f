"""Run a call with a hard time bound, from any thread: a dedicated worker process.

math-verify bounds its own time with `signal.alarm`, which works only in a process's main thread,
and some inputs (`9^{9^{9^{9}}}`, very long sums) make sympy run for seconds or forever. A node
scores untrusted peer text from worker threads, so the bound must not depend on signals and must
not leave a runaway computation behind. `BoundedRunner` keeps one worker process (a fresh
interpreter; on Linux it dies with the thread that started it) and sends each call over a pipe,
waiting at most `timeout_s` for the answer. A call that overruns kills the worker (the next call
starts a fresh one; startup is not counted against the per-call bound), and the caller gets
`Outcome(status="timeout")`. Calls from several threads are serialised by a lock.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import subprocess
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Literal

Status = Literal["ok", "timeout", "error", "crashed"]


@dataclass(frozen=True)
class Outcome:
    """The result of one bounded call. `value` is set only when status == "ok"; `detail` says why not."""

    status: Status
    value: Any = None
    detail: str = ""


def _worker_loop(requests: Connection, answers: Connection, preload: Sequence[str]) -> None:
    """Worker process loop: import `preload`, say ready, then answer (fn, args) requests until None or EOF."""
    for name in preload:
        importlib.import_module(name)
    answers.send(("ready", None))
    while True:
        try:
            request = requests.recv()
        except EOFError:  # the parent went away
            return
        except Exception:  # a request that cannot be unpickled; the worker stays usable
            answers.send(("error", traceback.format_exc(limit=5)))
            continue
        if request is None:
            return
        fn, args = request
        try:
            answers.send(("ok", fn(*args)))
        except Exception:  # reported to the parent, which decides; the worker stays usable
            answers.send(("error", traceback.format_exc(limit=5)))


def _die_with_parent() -> None:
    """Linux: have the kernel kill this worker when its parent dies (a runaway call must not outlive it)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def serve(argv: Sequence[str]) -> None:
    """Entry point of the worker process: argv = [request fd, answer fd, preload modules...]."""
    _die_with_parent()
    requests = Connection(int(argv[0]), writable=False)
    answers = Connection(int(argv[1]), readable=False)
    _worker_loop(requests, answers, argv[2:])


_WORKER_CMD = "import sys; from swarm_node.tasks.bounded import serve; serve(sys.argv[1:])"


def _stop(proc: subprocess.Popen[bytes], *conns: Connection) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    for conn in conns:
        conn.close()


class BoundedRunner:
    """Calls picklable module-level functions in a worker process, each bounded in time.

    After a timeout or a crash a replacement worker is launched at once, so its startup overlaps
    with the caller's other work. Counters (for metrics): calls, timeouts, errors, crashes, starts."""

    def __init__(
        self,
        timeout_s: float,
        *,
        preload: Sequence[str] = (),
        warmup: tuple[Callable[..., Any], tuple[Any, ...]] | None = None,
        startup_timeout_s: float = 120.0,
    ) -> None:
        """`timeout_s`: default bound of one call. `preload`: modules the worker imports before it
        reports ready. `warmup`: one (fn, args) call made at every worker start, bounded by
        `startup_timeout_s`, so lazy first-use costs (grammars, caches) are not charged to a call."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.preload = tuple(preload)
        self.warmup = warmup
        self.calls = self.timeouts = self.errors = self.crashes = self.starts = 0
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._requests: Connection | None = None
        self._answers: Connection | None = None
        self._ready = False
        self._finalizer: weakref.finalize | None = None

    def _launch(self) -> None:
        """Start a worker process without waiting for it.

        A fresh interpreter, not fork (the node holds threads: torch, DHT clients) and not
        multiprocessing's spawn (it re-runs the caller's __main__ module, which breaks scripts
        without a main guard). It inherits sys.path through PYTHONPATH."""
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CMD, str(req_r), str(ans_w), *self.preload],
                pass_fds=(req_r, ans_w), env=env, stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(req_r)
            os.close(ans_w)
        self._proc = proc
        self._requests, self._answers = Connection(req_w, readable=False), Connection(ans_r, writable=False)
        self._ready = False
        self._finalizer = weakref.finalize(self, _stop, proc, self._requests, self._answers)
        self.starts += 1

    def _await_ready(self) -> None:
        """Wait (at most startup_timeout_s per phase) for the worker's ready message and its warmup."""
        assert self._proc is not None and self._requests is not None and self._answers is not None
        try:
            if not self._answers.poll(self.startup_timeout_s):
                raise EOFError(f"no ready message within {self.startup_timeout_s} s")
            self._answers.recv()
            if self.warmup is not None:
                self._requests.send(self.warmup)
                if not self._answers.poll(self.startup_timeout_s):
                    raise EOFError(f"warmup call took over {self.startup_timeout_s} s")
                status, detail = self._answers.recv()
                if status != "ok":
                    raise EOFError(f"warmup call failed: {detail}")
        except (EOFError, OSError) as e:
            code = self._proc.poll()
            self._discard()
            raise RuntimeError(f"bounded worker failed to start (exit code {code}): {e}") from e
        self._ready = True

    def _discard(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._proc = self._requests = self._answers = self._finalizer = None
        self._ready = False

    def _ensure_ready(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self._discard()
            self._launch()
        if not self._ready:
            self._await_ready()

    def launch(self) -> None:
        """Start the worker process now without waiting for it (no-op when one is running), so its
        startup overlaps the caller's other work; the first call waits for what is left of it."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._discard()
                self._launch()

    def start(self) -> None:
        """Start the worker now and wait until it is ready (else the first call does), so startup
        happens off the critical path."""
        with self._lock:
            self._ensure_ready()

    def _replace(self) -> None:
        self._discard()
        self._launch()

    def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Outcome:
        """Run fn(*args) in the worker; waits at most `timeout_s` (default: the runner's) for the
        answer, not counting the worker's startup."""
        bound = self.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self._ensure_ready()
            assert self._requests is not None and self._answers is not None
            self.calls += 1
            try:
                self._requests.send((fn, args))
                if not self._answers.poll(bound):
                    self.timeouts += 1
                    self._replace()
                    return Outcome("timeout", detail=f"no answer within {bound} s")
                status, value = self._answers.recv()
            except (EOFError, OSError) as e:  # the worker died (killed, out of memory)
                self.crashes += 1
                self._replace()
                return Outcome("crashed", detail=f"worker died: {e!r}")
            if status == "error":
                self.errors += 1
                return Outcome("error", detail=value)
            return Outcome("ok", value=value)

    def counters(self) -> dict[str, int]:
        return {"calls": self.calls, "timeouts": self.timeouts, "errors": self.errors,
                "crashes": self.crashes, "starts": self.starts}

    def close(self) -> None:
        """Stop the worker (it holds no state worth a graceful exit); a later call starts a new one."""
        with self._lock:
            self._discard()
