"""`swarm-node local` with tiny models, observed the way a researcher would: the dashboard in a real
headless Chromium, `swarm-node status --json`, Ctrl-C, each node's peer ledger (`status --peers`),
then `swarm-node report` on the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_dashboard_browser import CHART_IDS, artifacts_dir, check_dashboard_in_browser, chromium_paths
from tests.procs import FULL_AND_LORA, tiny_toml, wait_for_line

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

def tiny_local(cache: Path) -> str:
    return tiny_toml(cache, nodes=2, train={"learning_rate": 1e-3},
                     swarm={"swarm_id": "itest-local", "fetch_timeout_s": 3.0, "window_seconds": 10.0}) + FULL_AND_LORA


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "swarm_node", *args]


def test_local_swarm_status_dashboard_and_report(tmp_path):
    config = tmp_path / "local.toml"
    config.write_text(tiny_local(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    out = tmp_path / "local.out"
    env = {**os.environ, "COLUMNS": "200"}
    with open(out, "wb") as f:
        local = subprocess.Popen(cli("local", "--config", str(config), "--steps", "400", "--run-dir", str(run_dir)),
                                 stdout=f, stderr=subprocess.STDOUT, env=env)
    dash = None
    try:
        bootstrap = wait_for_line(out, r"bootstrap DHT: (\S+)", 120, [local]).group(1)
        node_logs = [run_dir / "node0-full" / "node.log", run_dir / "node1-lora" / "node.log"]
        peer_ids = [wait_for_line(log, r"peer id (\S+)", 180, [local]).group(1) for log in node_logs]

        # `status --json` lists both nodes with their model and a step > 0.
        deadline = time.monotonic() + 120
        while True:
            res = subprocess.run(cli("status", "--initial-peer", bootstrap, "--swarm-id", "itest-local", "--json",
                                     "--timeout", "10"), capture_output=True, text=True, timeout=90)
            assert res.returncode == 0, res.stderr[-2000:]
            rows = {r["peer_id"]: r for r in json.loads(res.stdout)}
            if all(p in rows and rows[p]["step"] > 0 for p in peer_ids):
                break
            assert time.monotonic() < deadline, f"status never listed both nodes: {rows.keys()}"
            time.sleep(2)
        assert {rows[p]["model_id"] for p in peer_ids} == {"tiny-random:64x1:a"}
        assert all(rows[p]["metrics"]["own_samples"] == 8 for p in peer_ids)

        if chromium_paths() is None:
            pytest.skip("chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
        pytest.importorskip("selenium", reason="needs selenium")
        dash_out = tmp_path / "dashboard.out"
        with open(dash_out, "wb") as f:
            dash = subprocess.Popen(cli("dashboard", "--initial-peer", bootstrap, "--swarm-id", "itest-local",
                                        "--port", "0", "--poll-interval", "1.0"), stdout=f, stderr=subprocess.STDOUT)
        url = wait_for_line(dash_out, r"dashboard: (http\S+)", 120, [dash]).group(1)
        state = check_dashboard_in_browser(url + "?poll_ms=1000", peer_ids, artifacts_dir() / "dashboard_local_swarm.png",
                                           timeout_s=150)
        assert all(set(peer_ids) <= set(state[c]) for c in CHART_IDS)
    finally:
        if dash is not None:
            dash.send_signal(signal.SIGINT)
            try:
                dash.wait(timeout=60)
            except subprocess.TimeoutExpired:
                dash.kill()
        local.send_signal(signal.SIGINT)  # Ctrl-C: every node finishes its step and checkpoints
        rc = local.wait(timeout=180)
    assert rc == 130, out.read_text(errors="replace")[-3000:]
    for name in ("node0-full", "node1-lora"):
        assert (run_dir / name / "checkpoints" / "latest").exists()
    # Each node's peer ledger (written at its last checkpoint) lists the other, with samples it took.
    for name, other in (("node0-full", peer_ids[1]), ("node1-lora", peer_ids[0])):
        res = subprocess.run(cli("status", "--peers", "--node-dir", str(run_dir / name), "--json"),
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        ledger = {r["peer_id"]: r for r in json.loads(res.stdout)}
        assert set(ledger) == {other} and ledger[other]["taken"] >= 1 and ledger[other]["samples"] >= 1, ledger
    report = subprocess.run(cli("report", str(run_dir)), capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    summary = (run_dir / "report" / "summary.md").read_text()
    assert "node0-full" in summary and "node1-lora" in summary
    assert len(list((run_dir / "report").glob("*.png"))) >= 3
    # An honest swarm raises no false alarm: every replica (the bootstrap's included) shares the
    # nodes' window schedule, so none refuses their records.
    for name in ("node0-full", "node1-lora"):
        log = (run_dir / name / "node.log").read_text(errors="replace")
        assert "DHT refused" not in log, [line for line in log.splitlines() if "DHT refused" in line]
