"""The JSONL log of a step's metrics (`metrics.jsonl`): the writer, the readers and resuming (the
names: `metric_names.py`; the Prometheus exporter: `prometheus.py`)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from swarm_node.metric_names import STEP


class JsonlMetricsWriter:
    """Append one JSON object per step to `path`.

    Each record is flushed at once (a crash loses at most the record being written) and fsynced
    at most every `fsync_interval_s` seconds and on close, so logging never dominates a step.
    A partial last line left by a killed process is cut off when the file is reopened, so later
    records never fuse with it.
    """

    def __init__(self, path: Path | str, fsync_interval_s: float = 5.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _truncate_partial_tail(self.path)
        self._fsync_interval_s = fsync_interval_s
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")
        self._last_fsync = time.monotonic()
        self._lock = threading.Lock()

    def write(self, metrics: Mapping[str, float]) -> None:
        """Append one step's metrics (non-finite floats are written as JSON NaN/Infinity)."""
        line = json.dumps({str(k): as_number(k, v) for k, v in metrics.items()}, allow_nan=True)
        with self._lock:
            if self._file is None:
                raise ValueError(f"metrics writer for {self.path} is closed")
            self._file.write(line + "\n")
            self._file.flush()
            now = time.monotonic()
            if now - self._last_fsync >= self._fsync_interval_s:
                os.fsync(self._file.fileno())
                self._last_fsync = now

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None

    def __enter__(self) -> JsonlMetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def as_number(key: Any, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            return float(value)
        except (TypeError, ValueError) as e:
            raise TypeError(f"metric {key!r} is not a number: {value!r}") from e
    return value


def _truncate_partial_tail(path: Path) -> None:
    """If `path` ends without a newline (a torn write), cut it back to the last complete line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        block = 1 << 16
        pos = size
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                f.truncate(start + idx + 1)
                return
            pos = start
        f.truncate(0)


def read_metrics_jsonl(path: Path | str) -> list[dict[str, float]]:
    """Read a metrics log. A truncated final line (a killed writer) is ignored; a corrupt line
    anywhere else raises ValueError, since that is not something a crash produces."""
    records: list[dict[str, float]] = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    # After split, a complete file ends with "" (its trailing newline); anything else is a torn tail.
    complete, tail = lines[:-1], lines[-1]
    for lineno, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: corrupt metrics record: {e}") from e
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}: metrics record is not an object")
        records.append(obj)
    if tail.strip():
        try:
            obj = json.loads(tail)
        except json.JSONDecodeError:
            obj = None  # torn final write: drop it
        if isinstance(obj, dict):
            records.append(obj)
    return records


def supersede_after(path: Path | str, step: int) -> int:
    """A node resuming at `step`: move the rows of later steps (from a run whose weights were lost)
    to `<name>.superseded.jsonl` next to the log, so the log holds one row per step. Both files are
    rewritten atomically (the superseded file first, so no row is ever lost). Returns rows moved."""
    from swarm_node.util.atomic import atomic_write_text

    path = Path(path)
    if not path.exists():
        return 0
    _truncate_partial_tail(path)
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    keep, moved = [], []
    for ln in lines:
        try:
            later = float(json.loads(ln).get(STEP, 0)) > step
        except (ValueError, AttributeError):
            later = False  # not ours to judge: keep it where it is
        (moved if later else keep).append(ln)
    if not moved:
        return 0
    old = path.with_name(path.stem + ".superseded" + path.suffix)
    previous = old.read_text(encoding="utf-8") if old.exists() else ""
    atomic_write_text(old, previous + "".join(ln + "\n" for ln in moved))
    atomic_write_text(path, "".join(ln + "\n" for ln in keep))
    return len(moved)
