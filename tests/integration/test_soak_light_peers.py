"""The soak's light peers (benchmarks/soak/light_peers.py) as a real process on a real DHT: no torch
in the process, and every group they publish is one a node's exchange accepts, also when a step
of a process's later peers falls in the next window (found by the soak: they were refused as
`index_mismatch` and then excluded, because all peers of a process used the window their first
peer's step started in)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from protocol import keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
SWARM = "light-soak"
WINDOW_S = 3.0  # short windows: the peers' steps cross window boundaries within the test


def test_light_peers_publish_groups_a_node_takes_without_drops(dht_factory, tmp_path) -> None:
    from swarm_node.policy import tiny
    from swarm_node.policy.models import tokenizer_fingerprint
    from swarm_node.swarm.exchange import RolloutExchange
    from swarm_node.swarm.index import owned_key_schedule
    from swarm_node.tasks.base import Problem

    schedule = owned_key_schedule(SWARM, WINDOW_S, 4)
    boot = dht_factory(SWARM, owned_keys=schedule)
    node = dht_factory(SWARM, initial_peers=boot.visible_maddrs, owned_keys=schedule)
    tok = tiny.build_tiny_tokenizer("a")
    problems = [Problem(index=i, question=f"What is {i} + 1?", answer=str(i + 1)) for i in range(500)]
    (tmp_path / "prompts.json").write_text(json.dumps(
        {"id": "arithmetic-test", "problems": [[p.sha256, p.answer] for p in problems]}))
    spec = {
        "count": 3, "swarm_id": SWARM, "initial_peers": [str(m) for m in boot.visible_maddrs], "host": "127.0.0.1",
        "window_seconds": WINDOW_S, "staleness": 4, "storage_caps": [256, 256 << 10, 256 << 10],
        "fingerprint": tokenizer_fingerprint(tok), "vocab_size": len(tok), "max_new_tokens": 32, "group_size": 8,
        "char_ids": {chr(c): tok.encode(chr(c), add_special_tokens=False)[0] for c in range(32, 127)},
        "eos_id": tok.eos_token_id, "prompts_per_step": 4, "max_groups": 4, "max_per_peer": 2, "fetch_timeout": 5.0,
        "record_ttl_s": 60.0, "seed": 0, "stop_at": time.time() + 25, "prompt_file": str(tmp_path / "prompts.json"),
        "out": str(tmp_path / "light.jsonl"), "key_dir": str(tmp_path / "keys"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.soak.light_peers", str(tmp_path / "spec.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "light peers up: 3 (torch imported: False)" in proc.stdout

    rows = [json.loads(line) for line in (tmp_path / "light.jsonl").read_text().splitlines()]
    senders = {r["peer"] for r in rows}
    assert len(senders) == 3 and all(r["published"] == 4 for r in rows)
    assert sum(r["store_failures"] for r in rows) == 0
    # the node reads the windows they published in: every listed group is taken, none dropped
    exchange = RolloutExchange(node, SWARM, vocab_size=len(tok), max_new_tokens=32, window_seconds=WINDOW_S,
                               tokenizer_fingerprint=tokenizer_fingerprint(tok), cross_tokenizer=True, record_ttl_s=60.0)
    newest = max(r["window"] for r in rows)
    assert newest > min(r["window"] for r in rows)  # the steps spanned several windows
    got, drops = exchange.fetch_groups(newest, 4, 64, 64, 10.0, random.Random(0))
    listed = [r for r in rows if r["window"] >= newest - 4]
    assert not drops, drops
    assert len(got) == 4 * len(listed)
    assert {g.sender for g in got} == senders
    assert all(keys.window_of(g.created_at, WINDOW_S) >= newest - 4 for g in got)


def test_each_light_step_takes_the_window_and_slot_of_its_own_start() -> None:
    """The smallest case of the soak's finding: peers stepping one after another across a window
    boundary each use the window their own step started in (slot 0 there), and a second step in
    the same window takes the next slot."""
    from benchmarks.soak.light_peers import step_slot

    first = step_slot((-1, -1), 59.9, 30.0)  # window 1
    later = step_slot((-1, -1), 60.1, 30.0)  # the next peer of the same tick: window 2
    assert first == (1, 0) and later == (2, 0)
    assert step_slot(later, 75.0, 30.0) == (2, 1)
    assert step_slot((2, 1), 90.0, 30.0) == (3, 0)
