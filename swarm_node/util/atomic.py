"""Atomic file writes: write to a temporary file in the same directory, fsync, then rename.

Everything the node persists (checkpoints, identity keys, configs) goes through here, so a node
killed at any moment leaves either the old file or the new one, never a torn one. A directory that
several processes may need (a converted model, a warm-up) is built once under an exclusive file
lock and published whole (`ensure_dir`); `file_lock` is that lock, also used to claim work.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    atomic_write_with(path, lambda tmp: tmp.write_bytes(data), mode=mode)


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    atomic_write_bytes(path, text.encode(), mode=mode)


def atomic_write_with(path: Path, writer: Callable[[Path], None], mode: int = 0o644) -> None:
    """Call `writer(tmp_path)` to produce the file, then move it into place atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, mode)
        writer(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def atomic_replace_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Move a fully written directory into place. An existing `final_dir` is replaced.

    The old directory is first renamed aside, so at every instant either the old or the new
    directory is complete under its own name; a leftover `*.old` is removed on the next call.
    """
    final_dir = Path(final_dir)
    old = final_dir.with_name(final_dir.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    for root, _dirs, files in os.walk(tmp_dir):
        for name in files:
            with open(Path(root) / name, "rb") as f:
                os.fsync(f.fileno())
    if final_dir.exists():
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    fsync_dir(final_dir.parent)
    if old.exists():
        shutil.rmtree(old)


def ensure_dir(final: Path, build: Callable[[Path], None], wait: bool = True) -> Path | None:
    """Return `final`, building it with `build(tmp_dir)` under an exclusive lock if it is absent.

    The directory is published with `atomic_replace_dir`, so it exists only when complete.
    Leftover temporary directories from killed processes are removed under the lock. `wait=False`:
    None at once when another process holds the lock (is building it)."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(final.with_name(final.name + ".lock"), wait) as held:
        if not held:
            return None
        if final.is_dir():  # another process finished while we waited
            return final
        for stale in final.parent.glob(f".{final.name}.*.tmp"):
            shutil.rmtree(stale, ignore_errors=False)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
        try:
            build(tmp)
            atomic_replace_dir(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return final


@contextmanager
def file_lock(path: Path, wait: bool = True) -> Iterator[bool]:
    """An exclusive `flock` on `path` for the block; yields whether it is held (always, with `wait`;
    without, False when another process holds it). The kernel releases it if the process dies."""
    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
