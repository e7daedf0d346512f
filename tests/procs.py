"""Helpers for tests that run real `swarm-node` processes: a tiny node's config and waiting on them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from swarm_node.config.toml_text import to_toml

TINY_MODEL = "tiny-random:64x1:a"


def tiny_config(cache: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """A node config of the tiny model (4 completions of <= 8 tokens, 2 prompts a step, level-1
    arithmetic): `sections` update its tables (`swarm={...}`, `checkpoint={...}`) or, given a
    non-dict value, set top-level keys (`node_dir=...`)."""
    data: dict[str, Any] = {
        "model": {"name": TINY_MODEL, "cache_dir": str(cache), "device": "cpu"},
        "generation": {"group_size": 4, "max_new_tokens": 8},
        "train": {"prompts_per_step": 2},
        "task": {"levels": [1], "size": 50},
    }
    for key, value in sections.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return data


def tiny_toml(cache: Path, **sections: Any) -> str:
    return to_toml(tiny_config(cache, **{k: str(v) if isinstance(v, Path) else v for k, v in sections.items()}))


def wait_until(pred: Callable[[], Any], timeout: float, what: str, procs: Iterable[subprocess.Popen] = (),
               log: Path | None = None, poll_s: float = 0.5) -> float:
    """Poll `pred` until it is true; returns the seconds it took. Fails at once, with the tail of
    `log`, when one of `procs` exits first, and after `timeout` seconds otherwise."""
    procs = list(procs)
    start = time.monotonic()

    def tail() -> str:
        return ":\n" + log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""

    while time.monotonic() - start < timeout:
        if pred():
            return time.monotonic() - start
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a process exited ({p.returncode}) while waiting for {what}{tail()}")
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{tail()}")


FULL_AND_LORA = """
[[node]]
name = "full"
set = []

[[node]]
name = "lora"
set = ["model.lora.enabled=true", "model.lora.rank=4"]
"""  # the `[[node]]` tables of a `swarm-node local` file: one full, one LoRA node


def jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file a process is writing (a line being written is skipped)."""
    out = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def wait_for_line(path: Path, pattern: str, timeout: float, procs: Iterable[subprocess.Popen] = ()) -> re.Match:
    """The first match of `pattern` in the text file `path` once it appears (see `wait_until`)."""
    found: list[re.Match] = []

    def seen() -> bool:
        m = re.search(pattern, path.read_text(errors="replace")) if path.exists() else None
        found[:] = [m] if m else []
        return m is not None

    wait_until(seen, timeout, f"a line matching {pattern!r} in {path}", procs, log=path)
    return found[0]


def start_join(config: Path, log: Path) -> subprocess.Popen:
    """`swarm-node join --config CONFIG` as a process (one torch thread), its output appended to `log`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "swarm_node", "join", "--config", str(config)],
                                stdout=f, stderr=subprocess.STDOUT, env=env)
