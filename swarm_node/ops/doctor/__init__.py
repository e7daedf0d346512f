"""`swarm-node doctor`: a checklist a volunteer runs before or after `join`.

Each line: the check, its result (pass, warn, fail, skip), what was found and, when something is
wrong, what to do. Required checks decide the exit code (0 only when none failed); advisory ones
only inform. The checks themselves live in doctor/checks.py (this machine) and doctor/swarm.py (the swarm); preflight.py's checks are reused.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from swarm_node.ops.doctor import checks as dc
from swarm_node.ops.doctor import swarm as ds
from swarm_node.config import NodeConfig


@dataclass(frozen=True)
class Check:
    name: str
    required: bool
    run: Callable[[], dc.Result]


@dataclass
class Line:
    check: str
    required: bool
    status: str
    detail: str
    fix: str
    seconds: float
    more: tuple[str, ...] = ()  # further lines under the result (the memory plan, part by part)


def local_checks(cfg: NodeConfig) -> list[Check]:
    def bind(fn: Callable[[NodeConfig], dc.Result]) -> Callable[[], dc.Result]:
        return lambda: fn(cfg)

    return [
        Check("python", True, bind(dc.check_python)),
        Check("torch", True, bind(dc.check_torch)),
        Check("vllm", cfg.generation.backend == "vllm", bind(dc.check_vllm)),
        Check("gpu", cfg.model.device.startswith("cuda"), bind(dc.check_gpu)),
        Check("model", True, bind(dc.check_model)),
        Check("disk", True, bind(dc.check_disk)),
        Check("memory", True, bind(dc.check_memory)),
        Check("ports", True, bind(dc.check_ports)),
    ]


def swarm_checks(cfg: NodeConfig, probe: ds.SwarmProbe) -> list[Check]:
    joining = bool(cfg.swarm.initial_peers)
    return [
        Check("initial peers", joining, lambda: ds.check_initial_peers(cfg)),
        Check("dht join", True, probe.start),
        Check("reachability", False, lambda: ds.check_reachability(probe)),
        Check("relay", False, lambda: ds.check_relay(probe)),
        Check("dht round trip", joining, lambda: ds.check_round_trip(probe)),
        Check("clock", joining, lambda: ds.check_clock(probe)),
    ]


def run_checks(checks: list[Check], progress: TextIO | None = None) -> list[Line]:
    lines = []
    for c in checks:
        live = progress is not None and progress.isatty()
        if live:
            progress.write(f"  checking {c.name}...\r")
            progress.flush()
        t0 = time.perf_counter()
        try:
            r = c.run()
        except Exception as e:  # noqa: BLE001  (a check that crashes is a failed check, shown like the others)
            r = dc.failed_result(e)
        lines.append(Line(c.name, c.required, r.status, r.detail, r.fix, round(time.perf_counter() - t0, 3), r.more))
        if live:
            progress.write(" " * 40 + "\r")
        if progress is not None:
            progress.write(render_line(lines[-1]) + "\n")
            progress.flush()
    return lines


def exit_code(lines: list[Line]) -> int:
    return 1 if any(ln.required and ln.status == dc.FAIL for ln in lines) else 0


_MARK = {dc.PASS: "ok  ", dc.WARN: "WARN", dc.FAIL: "FAIL", dc.SKIP: "skip"}


def render_line(ln: Line) -> str:
    kind = "required" if ln.required else "advisory"
    text = f"[{_MARK[ln.status]}] {ln.check:<15} {kind:<9} {ln.detail}"
    text += "".join(f"\n       {more}" for more in ln.more)
    return text + (f"\n       -> {ln.fix}" if ln.fix and ln.status in (dc.FAIL, dc.WARN) else "")


def summary(lines: list[Line]) -> str:
    failed = [ln.check for ln in lines if ln.required and ln.status == dc.FAIL]
    warned = [ln.check for ln in lines if ln.status == dc.WARN or (not ln.required and ln.status == dc.FAIL)]
    if failed:
        return f"doctor: {len(failed)} required check(s) failed: {', '.join(failed)}"
    return "doctor: all required checks passed" + (f" ({len(warned)} to look at: {', '.join(warned)})" if warned else "")


def run_doctor(cfg: NodeConfig, *, as_json: bool, timeout: float = 20.0, swarm: bool = True) -> int:
    """Run every check; print lines (progress on stderr as they finish) or one JSON object; the exit code."""
    progress = sys.stdout if not as_json else (sys.stderr if sys.stderr.isatty() else None)
    lines = run_checks(local_checks(cfg), progress)
    if swarm and cfg.swarm.enabled:
        probe = ds.SwarmProbe(cfg, timeout)
        try:
            lines += run_checks(swarm_checks(cfg, probe), progress)
        finally:
            probe.shutdown()
    code = exit_code(lines)
    if as_json:
        out: dict[str, Any] = {"ok": code == 0, "exit_code": code, "checks": [asdict(ln) for ln in lines]}
        print(json.dumps(out, indent=1))
    else:
        print(summary(lines))
    return code
