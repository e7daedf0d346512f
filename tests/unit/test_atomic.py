"""Atomic writes, directories built once under a lock, and the lock that claims work."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from swarm_node.util.atomic import atomic_replace_dir, atomic_write_text, atomic_write_with, ensure_dir, file_lock


def test_atomic_write_leaves_the_old_file_when_the_writer_fails(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    atomic_write_text(path, "old")

    def writer(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write_with(path, writer)
    assert path.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["config.toml"]


def test_replace_dir_swaps_a_whole_directory(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    for text in ("one", "two"):
        tmp = tmp_path / f"tmp-{text}"
        tmp.mkdir()
        (tmp / "weights").write_text(text)
        atomic_replace_dir(tmp, final)
    assert (final / "weights").read_text() == "two" and sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_cached_directory_is_built_once_under_concurrency(tmp_path: Path) -> None:
    calls: list[int] = []

    def build(out: Path) -> None:
        calls.append(1)
        time.sleep(0.2)
        (out / "payload").write_text("done")

    final = tmp_path / "model"
    (tmp_path / ".model.abc.tmp").mkdir()  # left by a killed conversion
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_dir(final, build))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results == [final] * 3
    assert (final / "payload").read_text() == "done"
    assert not list(tmp_path.glob(".model.*.tmp"))


def test_failed_build_leaves_no_directory(tmp_path: Path) -> None:
    def build(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        ensure_dir(tmp_path / "model", build)
    assert not (tmp_path / "model").exists() and not list(tmp_path.glob(".model.*.tmp"))


def test_ensure_dir_without_wait_gives_none_while_another_builds(tmp_path: Path) -> None:
    final = tmp_path / "warm"
    with file_lock(tmp_path / "warm.lock") as held:  # another builder holds the lock
        assert held
        assert ensure_dir(final, lambda out: (out / "x").write_text("x"), wait=False) is None
    assert not final.exists()
    assert ensure_dir(final, lambda out: (out / "x").write_text("x"), wait=False) == final


def test_file_lock_is_exclusive_across_processes_and_freed_when_the_holder_dies(tmp_path: Path) -> None:
    lock = tmp_path / "seed0.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom swarm_node.util.atomic import file_lock\n"
         "with file_lock(__import__('pathlib').Path(sys.argv[1])):\n    print('held', flush=True)\n"
         "    time.sleep(60)\n", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with file_lock(lock, wait=False) as held:
            assert held is False
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 5
    while True:  # the kernel frees an flock when its holder dies
        with file_lock(lock, wait=False) as held:
            if held:
                break
        assert time.monotonic() < deadline, "the lock of a killed process was never freed"
        time.sleep(0.05)
