"""A keeper's background thread: `tick()` every `check_interval_s` seconds until `stop()`.

Shared by the membership keeper (swarm/membership.py) and the prompt-set keeper
(swarm/prompt_keeper.py). A RuntimeError from `tick` means the transport shut down under the
thread: it stops quietly. A subclass decides, in `_tick_once`, what else ends the thread.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class PeriodicThread:
    """Mixin: call `_init_thread()` in `__init__`; define `tick()`, `check_interval_s` and
    `thread_name`; override `_wants_thread` (start at all?) and `_tick_once` (False ends the loop)."""

    check_interval_s: float
    thread_name: str = "keeper"

    def _init_thread(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> object:
        raise NotImplementedError

    def _wants_thread(self) -> bool:
        return True

    def _tick_once(self) -> bool:
        self.tick()
        return True

    def start(self) -> None:
        if self._thread is None and self._wants_thread():
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.check_interval_s):
            try:
                if not self._tick_once():
                    return
            except RuntimeError as e:  # the transport shut down under us: stop quietly
                log.debug("%s stops: %s", self.thread_name, e)
                return

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
