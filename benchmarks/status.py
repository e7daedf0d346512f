"""`swarm-node status` against a small local swarm it starts itself (real hivemind DHTs on loopback).

The swarm: `--peers` DHT peers (one the bootstrap), each publishing a status record like a node's.
Measured:

* cold: wall time of a fresh `python -m swarm_node status -p ADDR --json` process, from
  exec to exit, `--repeats` times (the median is the headline; the goal is <= 2 s on a quiet
  machine); the baseline, cold_full_hivemind: a fresh process reading the same way through the
  full hivemind (torch imported, a DHT process), as one-shot `status` did before swarm/light.py;
* connect: in this process, `observe.connect_observer` (the observer's DHT up and joined);
* warm: the second `read_statuses` of the same observer (the first one warms the connections).

The machine's 1-minute load average before and after is printed with the result: the figures
are only comparable on a quiet machine.

    python -m benchmarks.status [--peers 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import emit, parse_args

SWARM = "bench-status"
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def _start_swarm(n: int, root: Path) -> list:
    from protocol.messages import NodeStatus
    from swarm_node.swarm.dht import HivemindTransport
    from swarm_node.swarm.exchange import RolloutExchange
    from swarm_node.swarm.identity import load_node_identity
    from swarm_node.swarm.index import owned_key_schedule

    schedule = owned_key_schedule(SWARM, 30.0, 4)
    first = HivemindTransport(load_node_identity(root / "p0"), SWARM, host_maddrs=LOOPBACK, owned_keys=schedule)
    peers = [first]
    for i in range(1, n):
        peers.append(HivemindTransport(load_node_identity(root / f"p{i}"), SWARM, host_maddrs=LOOPBACK,
                                       initial_peers=first.usable_maddrs or first.visible_maddrs,
                                       owned_keys=schedule))
    for i, t in enumerate(peers):
        ok = RolloutExchange(t, SWARM, vocab_size=1).publish_status(NodeStatus(
            peer_id=t.peer_id, role="trainer", model_id=f"model-{i}", step=i, timestamp=t.dht_time(),
            maddrs=tuple(t.visible_maddrs), metrics={"reward_mean": 0.5}))
        if not ok:
            raise RuntimeError(f"peer {i} could not store its status record")
    return peers


# The baseline: what a one-shot status did before the light reader (full hivemind, torch, a DHT process).
_FULL_PATH = """
import json, os, sys
from swarm_node.observe.observer import connect_observer, status_rows
transport, exchange = connect_observer([sys.argv[1]], sys.argv[2], self_heal=False, timeout=30.0)
print(json.dumps(status_rows(exchange.read_statuses(timeout=10.0))), flush=True)
transport.shutdown()
os._exit(0)
"""


def _cold(addr: str, expected: int, full: bool = False) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = (["-c", _FULL_PATH, addr, SWARM] if full else
           ["-m", "swarm_node", "status", "-p", addr, "--swarm-id", SWARM, "--json"])
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=120, env=env)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"status exited {out.returncode}: {out.stdout[-500:]} {out.stderr[-2000:]}")
    rows = json.loads(out.stdout)
    if len(rows) != expected:
        raise RuntimeError(f"status read {len(rows)} records, expected {expected}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser, {"peers": 2, "repeats": 1})
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        peers = _start_swarm(args.peers, Path(tmp))
        try:
            addr = peers[0].visible_maddrs[0]
            cold = [_cold(addr, args.peers) for _ in range(args.repeats)]
            cold_full = [_cold(addr, args.peers, full=True) for _ in range(args.repeats)]
            from swarm_node.observe.observer import connect_observer

            t0 = time.perf_counter()
            transport, exchange = connect_observer([addr], SWARM, self_heal=False, timeout=30.0)
            connect_s = time.perf_counter() - t0
            try:
                t0 = time.perf_counter()
                first = exchange.read_statuses(timeout=10.0)
                first_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                second = exchange.read_statuses(timeout=10.0)
                warm_s = time.perf_counter() - t0
            finally:
                transport.shutdown()
            if len(first) != args.peers or len(second) != args.peers:
                raise RuntimeError(f"in-process reads found {len(first)} and {len(second)} records")
        finally:
            for t in peers:
                t.shutdown()
    emit({
        "benchmark": "status",
        "config": vars(args),
        "cold_s": [round(s, 3) for s in cold],
        "cold_s_median": round(statistics.median(cold), 3),
        "cold_full_hivemind_s": [round(s, 3) for s in cold_full],
        "cold_full_hivemind_s_median": round(statistics.median(cold_full), 3),
        "speedup_cold": round(statistics.median(cold_full) / statistics.median(cold), 2),
        "connect_s": round(connect_s, 3),
        "first_read_s": round(first_s, 3),
        "warm_read_s": round(warm_s, 3),
        "goal_cold_at_most_2s": statistics.median(cold) <= 2.0,
        "load_1min_before": round(load_before, 2),
        "load_1min_after": round(os.getloadavg()[0], 2),
    })


if __name__ == "__main__":
    main()
