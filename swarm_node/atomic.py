"""Atomic file writes: write to a temporary file in the same directory, fsync, then rename.

Everything the node persists (checkpoints, identity keys, configs) goes through here, so a node
killed at any moment leaves either the old file or the new one, never a torn one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
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
        _rmtree(old)
    for root, _dirs, files in os.walk(tmp_dir):
        for name in files:
            with open(Path(root) / name, "rb") as f:
                os.fsync(f.fileno())
    if final_dir.exists():
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    fsync_dir(final_dir.parent)
    if old.exists():
        _rmtree(old)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)
