"""`swarm-node train` with `eval.every_steps`: a real process on a tiny model evaluates itself while
it trains, and the trend shows in `evals.jsonl`, in `swarm-node status --heldout`, in `report` and
in the dashboard (Debian's chromium, as in test_dashboard_browser.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.integration.test_dashboard_browser import (
    HELDOUT_CHART,
    artifacts_dir,
    check_dashboard_in_browser,
    chromium_paths,
)
from tests.procs import jsonl_rows, tiny_toml

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

STEPS, EVERY = 6, 2  # evaluations before step 1 and after steps 2, 4, 6


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "swarm_node", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A node directory after `swarm-node train --steps 6` with eval.every_steps=2 (8 problems)."""
    tmp = tmp_path_factory.mktemp("trend")
    cfg = tmp / "node.toml"
    cfg.write_text(tiny_toml(tmp / "cache", generation={"group_size": 2, "max_new_tokens": 4},
                             train={"prompts_per_step": 1}, eval={"problems": 8, "every_steps": EVERY,
                                                                  "max_new_tokens": 4}))
    node = tmp / "node"
    res = cli("train", "-c", str(cfg), "--steps", str(STEPS), "--node-dir", str(node))
    assert res.returncode == 0, res.stderr[-3000:]
    return node


def test_train_logs_an_evaluation_every_n_steps(trained):
    rows = jsonl_rows(trained / "evals.jsonl")
    assert [r["step"] for r in rows] == [0, 2, 4, 6]
    for r in rows:
        assert r["n"] == 8 and len(r["outcomes"]) == 8 and r["lo"] <= r["accuracy"] <= r["hi"]
    metrics = jsonl_rows(trained / "metrics.jsonl")
    assert [int(r["eval_step"]) for r in metrics] == [0, 2, 2, 4, 4, 6]  # every step carries the latest


def test_status_heldout_shows_the_trend(trained):
    res = cli("status", "--heldout", "--node-dir", str(trained), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "4 held-out evaluations" in res.stdout
    # one line per evaluation: step, accuracy [95% interval], ...
    points = re.findall(r"^\s*(\d+)\s+(\d\.\d{3}) \[(\d\.\d{3}), (\d\.\d{3})\]", res.stdout, re.M)
    assert [int(p[0]) for p in points] == [0, 2, 4, 6]
    assert all(float(lo) <= float(acc) <= float(hi) for _, acc, lo, hi in points)
    res = cli("status", "--heldout", "--node-dir", str(trained), "--json", timeout=120)
    points = json.loads(res.stdout)
    assert [p["step"] for p in points] == [0, 2, 4, 6]
    assert points[0]["change"] is None
    assert all(p["change"]["verdict"] in ("improved", "no measurable change", "worse") for p in points[1:])
    assert all(p["change"]["test"] == "mcnemar_exact" for p in points[1:])  # the same 8 problems, paired


def test_report_plots_the_trend_and_states_the_verdict(trained):
    res = cli("report", str(trained), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    saved = json.loads((trained / "report" / "summary.json").read_text())[0]
    assert saved["heldout_evaluations"] == 4 and saved["heldout_after_step"] == STEPS
    assert saved["heldout_change"]["verdict"] in ("improved", "no measurable change", "worse")
    assert (trained / "report" / "heldout.png").stat().st_size > 5000


@pytest.mark.skipif(chromium_paths() is None,
                    reason="needs Debian chromium + chromium-driver (apt-get install -y chromium chromium-driver)")
def test_dashboard_draws_the_trend_of_the_node(trained):
    pytest.importorskip("selenium", reason="needs selenium (pip install selenium)")
    from swarm_node.observe.dashboard import DashboardServer, FakeStatusSource, HeldoutSource

    with DashboardServer(FakeStatusSource(), host="127.0.0.1", port=0, poll_interval_s=0.2,
                         heldout_source=HeldoutSource([trained])) as dash:
        state = check_dashboard_in_browser(dash.url + "?poll_ms=500", [str(trained)],
                                           artifacts_dir() / "dashboard_heldout_trend.png", min_points=4,
                                           charts=(HELDOUT_CHART,), table_peers=[])
        dash.check()
    assert state[HELDOUT_CHART] == {str(trained): 4}


def test_local_summary_states_each_nodes_change_with_intervals(tmp_path):
    """`swarm-node local`'s summary: per node, held-out before and after with 95% intervals and the
    verdict in words; summary.json holds the same numbers."""
    from tests.procs import FULL_AND_LORA

    cfg = tmp_path / "local.toml"
    cfg.write_text(tiny_toml(tmp_path / "cache", generation={"group_size": 2, "max_new_tokens": 4},
                             train={"prompts_per_step": 1}, eval={"max_new_tokens": 4},
                             swarm={"swarm_id": "itest-heldout-local", "fetch_timeout_s": 2.0,
                                    "window_seconds": 10.0}) + FULL_AND_LORA)
    run_dir = tmp_path / "run"
    res = cli("local", "-c", str(cfg), "--steps", "3", "--eval-problems", "8", "--run-dir", str(run_dir))
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    saved = json.loads((run_dir / "report" / "summary.json").read_text())
    assert sorted(r["name"] for r in saved) == ["node0-full", "node1-lora"]
    for r in saved:
        lo, hi = r["heldout_before_interval"]
        alo, ahi = r["heldout_after_interval"]
        line = (f"{r['name']}: held-out {r['heldout_before']:.3f} [{lo:.3f}, {hi:.3f}] -> "
                f"{r['heldout_after']:.3f} [{alo:.3f}, {ahi:.3f}] at step 3: {r['heldout_change']['verdict']} (")
        assert line in res.stdout, res.stdout[-3000:]
        assert r["heldout_change"]["test"] == "mcnemar_exact" and r["heldout_n"] == 8
        rows = jsonl_rows(run_dir / r["name"] / "evals.jsonl")
        assert [row["step"] for row in rows] == [0, 3]  # every_steps' default (10) is past the run's end
        assert (rows[0]["accuracy"], rows[-1]["accuracy"]) == (r["heldout_before"], r["heldout_after"])
