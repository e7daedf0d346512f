"""Two volunteers of different tokenizers started together with `swarm-node join` on a real DHT: a
fast one (a one-layer warm model of tokenizer c) and a slower one (a two-layer warm model of
tokenizer a), both on models that answer. With `send_text = auto` each sends text from its first step (no peer's
tokenizer known yet, then the other's seen), so each takes the other's groups within its first
steps; drops that say nothing about a sender's honesty (another tokenizer without text, a group
past the receiver's window) are no faults, so no node is ever `excluded_peer`; and each node's
`swarm-node status --given` shows what the other took and dropped of its groups."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from swarm_node.node.assemble import start_transport
from swarm_node.config import SwarmConfig
from tests.procs import jsonl_rows, start_join, tiny_toml, wait_until

# Two warm-ups and two `join` processes: minutes on two cores, so it runs with the slow tests.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
SWARM = "itest-honest"
FIRST_STEPS = 8  # each node takes a group of the other within its first FIRST_STEPS steps


def write_config(tmp: Path, name: str, model: Path, peers: list[str], seed: int) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(tiny_toml(
        tmp / "cache", node_dir=tmp / name,
        model={"name": str(model)}, generation={"group_size": 4, "max_new_tokens": 12},
        train={"total_steps": 1000, "seed": seed},
        swarm={"swarm_id": SWARM, "initial_peers": peers, "host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
               "fetch_timeout_s": 3.0, "window_seconds": 10.0, "max_peer_fraction": 0.75,
               "max_peer_groups_per_step": 6, "max_groups_per_peer": 4},
        metrics={"status_every_steps": 1, "status_min_interval_s": 0, "ledger_every_steps": 1}, checkpoint={"every_steps": 100}))
    return path




def rows(node_dir: Path) -> list[dict]:
    return [r for r in jsonl_rows(node_dir / "metrics.jsonl") if "step" in r]


def first_taking_step(node_dir: Path) -> int | None:
    return next((int(r["step"]) for r in rows(node_dir) if r.get("peer_groups", 0) > 0), None)


def status_given(bootstrap: str, node_dir: Path) -> dict:
    res = subprocess.run([sys.executable, "-m", "swarm_node", "status", "--given", str(node_dir),
                          "--initial-peer", bootstrap, "--swarm-id", SWARM, "--json", "--timeout", "15"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout[-1000:] + res.stderr[-2000:]
    return json.loads(res.stdout)


def test_two_tokenizers_joined_together_take_each_other_and_nobody_is_excluded(tmp_path, warm_model):
    models = {"fast": warm_model("tiny-random:64x1:c"), "slow": warm_model("tiny-random:64x2:a")}
    bootstrap = start_transport(SwarmConfig(swarm_id=SWARM, host_maddrs=["/ip4/127.0.0.1/tcp/0"]), tmp_path / "boot")
    procs: list[subprocess.Popen] = []
    try:
        peers = [str(a) for a in bootstrap.visible_maddrs]
        dirs = {name: tmp_path / name for name in models}
        logs = {name: tmp_path / f"{name}.log" for name in models}
        procs = [start_join(write_config(tmp_path, name, model, peers, seed), logs[name])
                 for seed, (name, model) in enumerate(models.items())]
        wait_until(lambda: all(first_taking_step(d) is not None for d in dirs.values()), 300,
                   "each node to take a group of the other", procs, log=logs["slow"])
        for name, d in dirs.items():
            assert first_taking_step(d) <= FIRST_STEPS, (name, [(r["step"], r.get("peer_groups")) for r in rows(d)])
        # Let the receipts of those steps reach the status records (published every step).
        wait_until(lambda: all(len(rows(d)) >= first_taking_step(d) + 2 for d in dirs.values()), 120,
                   "two more steps of each node", procs)
        views = {name: status_given(peers[0], d) for name, d in dirs.items()}
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=90)

        for name, d in dirs.items():
            excluded = [r["step"] for r in rows(d) if r.get("dropped_excluded_peer", 0) > 0]
            assert excluded == [], (name, excluded)
            sent = sum(r.get("text_groups", 0) for r in rows(d))
            assert sent > 0, name  # auto: text from the first steps
            ledger = json.loads((d / "peer_ledger.json").read_text())
            for peer in ledger["peers"]:
                assert peer["reputation"]["faults"] == 0.0 or peer["taken"] > 0, (name, peer)
        for name, view in views.items():
            other = "slow" if name == "fast" else "fast"
            other_ledger = json.loads((dirs[other] / "peer_ledger.json").read_text())
            assert view["peer_id"] != other_ledger["peer_id"]
            got = {r["receiver"]: r for r in view["receivers"]}
            assert other_ledger["peer_id"] in got, (name, view)
            receipt = got[other_ledger["peer_id"]]
            assert receipt["taken"] > 0, (name, receipt)  # what the other took of its groups
            # and what it dropped, by reason: what the other's ledger counts of this node's groups
            mine = next(p for p in other_ledger["peers"] if p["peer_id"] == view["peer_id"])
            assert set(receipt["dropped_by_reason"]) <= set(mine["dropped"]), (name, receipt, mine["dropped"])
            assert receipt["taken"] <= mine["taken"]
            assert view["totals"]["takers"] == 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        bootstrap.shutdown()
