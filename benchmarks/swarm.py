"""Rollout exchange over real hivemind DHTs on loopback: 2, 4 and 8 peers.

Each round every peer publishes `--groups` groups (G=8 completions of 256 tokens, Zipf token ids
over a 49,152 vocabulary, LM-like logprobs), then gathers a capped sample of its peers' groups
(`--max-groups` per round, `--max-per-peer` per peer), all peers at once (one thread each).
Reported per swarm size: publish and gather latency (mean and max over peers and rounds), payload
bytes sent/received per peer per round (values handed to / returned by the DHT) and, where
/proc allows, the p2p daemons' socket I/O per peer per round. The in-memory transport runs the
same rounds as the baseline (encode, validate, decode without a network).

    python -m benchmarks.swarm [--sizes 2 4 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.common import emit, parse_args
from protocol import keys
from swarm_node.swarm.exchange import RolloutExchange
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.synthetic import synthetic_group

SWARM = "bench"
WINDOW_S = 30.0
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def _start_dht_peers(n: int, root: Path, replicas: int) -> list:
    from swarm_node.swarm.dht import HivemindTransport
    from swarm_node.swarm.index import owned_key_schedule
    from swarm_node.swarm.identity import load_node_identity

    schedule = owned_key_schedule(SWARM, WINDOW_S, 4)
    first = HivemindTransport(load_node_identity(root / "p0"), SWARM, host_maddrs=LOOPBACK, owned_keys=schedule,
                              num_replicas=replicas)
    peers = [first]
    with ThreadPoolExecutor(max_workers=n) as pool:
        peers += list(pool.map(
            lambda i: HivemindTransport(load_node_identity(root / f"p{i}"), SWARM, host_maddrs=LOOPBACK,
                                        initial_peers=first.visible_maddrs, owned_keys=schedule,
                                        num_replicas=replicas),
            range(1, n)))
    return peers


def _daemon_io_bytes(transport) -> int | None:
    """Bytes the p2p daemon behind `transport` read+wrote through syscalls (sockets included)."""
    dht = getattr(transport, "_dht", None)
    if dht is None:
        return None
    try:
        children = Path(f"/proc/{dht.pid}/task/{dht.pid}/children").read_text().split()
        total = 0
        for pid in children:
            fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
            total += int(fields["rchar"]) + int(fields["wchar"])
        return total if children else None
    except (OSError, ValueError, KeyError):
        return None


def _round(exchanges: list[RolloutExchange], round_idx: int, args: argparse.Namespace) -> list[dict]:
    """One round: all peers publish together, then all gather together. Returns per-peer stats."""
    barrier = threading.Barrier(len(exchanges))

    def peer(i: int) -> dict:
        ex = exchanges[i]
        t = ex.transport
        rng = np.random.default_rng(1000 * round_idx + i)
        now = t.dht_time()
        window = keys.window_of(now, WINDOW_S)
        groups = [synthetic_group(rng, swarm_id=SWARM, sender=t.peer_id, created_at=now,
                                  prompt_index=round_idx * args.groups + j, policy_version=round_idx,
                                  group_size=8, tokens=256)
                  for j in range(args.groups)]
        before, io_before = Counter(t.traffic), _daemon_io_bytes(t)
        barrier.wait()
        t0 = time.perf_counter()
        ex.publish_groups(groups, window)
        publish_s = time.perf_counter() - t0
        barrier.wait()
        t0 = time.perf_counter()
        got, drops = ex.fetch_groups(window, 4, args.max_groups, args.max_per_peer, args.timeout,
                                     random.Random(round_idx * 97 + i))
        gather_s = time.perf_counter() - t0
        io_after = _daemon_io_bytes(t)
        return {
            "publish_s": publish_s, "gather_s": gather_s, "groups": len(got), "drops": sum(drops.values()),
            "index_keys": t.traffic["records_fetched"] - before["records_fetched"],
            "index_level": ex.index.level,
            "bytes_out": t.traffic["bytes_out"] - before["bytes_out"],
            "bytes_in": t.traffic["bytes_in"] - before["bytes_in"],
            "daemon_io": None if io_before is None or io_after is None else io_after - io_before,
        }

    with ThreadPoolExecutor(max_workers=len(exchanges)) as pool:
        return list(pool.map(peer, range(len(exchanges))))


def _summarise(rows: list[dict], n: int, startup_s: float | None) -> dict:
    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in rows)

    daemon = [r["daemon_io"] for r in rows if r["daemon_io"] is not None]
    return {
        "peers": n,
        "startup_s": None if startup_s is None else round(startup_s, 2),
        "publish_s_mean": round(mean("publish_s"), 4), "publish_s_max": round(max(r["publish_s"] for r in rows), 4),
        "gather_s_mean": round(mean("gather_s"), 4), "gather_s_max": round(max(r["gather_s"] for r in rows), 4),
        "round_overhead_s_mean": round(mean("publish_s") + mean("gather_s"), 4),
        "groups_gathered_mean": round(mean("groups"), 2),
        "drops_total": sum(r["drops"] for r in rows),
        "index_keys_read_per_gather_max": max(r["index_keys"] for r in rows),
        "index_levels": sorted({r["index_level"] for r in rows}),
        "payload_bytes_out_per_peer_round": round(mean("bytes_out")),
        "payload_bytes_in_per_peer_round": round(mean("bytes_in")),
        "payload_bytes_in_per_gathered_group": round(mean("bytes_in") / max(1e-9, mean("groups"))),
        "daemon_io_bytes_per_peer_round": round(statistics.fmean(daemon)) if daemon else None,
    }


def run_size(n: int, args: argparse.Namespace, backend: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        if backend == "dht":
            transports = _start_dht_peers(n, Path(tmp), args.replicas)
            startup_s = time.perf_counter() - t0
        else:
            swarm = MemorySwarm()
            transports = [MemoryTransport(swarm, f"peer{i}") for i in range(n)]
            startup_s = None
        try:
            exchanges = [RolloutExchange(t, SWARM, vocab_size=49_152, max_new_tokens=256, window_seconds=WINDOW_S)
                         for t in transports]
            rows = []
            for r in range(args.rounds + 1):
                stats = _round(exchanges, r, args)
                if r > 0:  # round 0 warms connections and routing tables
                    rows.extend(stats)
            return _summarise(rows, n, startup_s)
        finally:
            for t in transports:
                t.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4, help="groups each peer publishes per round")
    parser.add_argument("--max-groups", type=int, default=8)
    parser.add_argument("--max-per-peer", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--replicas", type=int, default=5, help="DHT replicas per record (hivemind's default 5)")
    args = parse_args(parser, {"sizes": [2], "rounds": 2, "groups": 1})

    results = {"memory": [], "dht": []}
    for n in args.sizes:
        for backend in ("memory", "dht"):
            res = run_size(n, args, backend)
            results[backend].append(res)
            print(backend, res, flush=True)
    dht = results["dht"]
    largest = dht[-1]
    # The fetch cap binds once a peer has more peers' groups on offer than it takes (from 4 peers on
    # with the defaults); bytes per peer should be flat from there.
    capped = [r for r in dht if r["groups_gathered_mean"] >= args.max_groups] or dht
    base = capped[0]
    emit({
        "benchmark": "swarm",
        "config": {**vars(args), "group_size": 8, "tokens": 256, "vocab": 49_152},
        "dht": dht,
        "memory_baseline": results["memory"],
        "round_overhead_s_at_largest": largest["round_overhead_s_mean"],
        "goal_round_overhead_below_1s": largest["round_overhead_s_mean"] < 1.0,
        "bytes_ratio_baseline_peers": base["peers"],
        "bytes_in_ratio_largest_vs_baseline": round(
            largest["payload_bytes_in_per_peer_round"] / max(1, base["payload_bytes_in_per_peer_round"]), 3),
        "bytes_out_ratio_largest_vs_baseline": round(
            largest["payload_bytes_out_per_peer_round"] / max(1, base["payload_bytes_out_per_peer_round"]), 3),
        "daemon_io_ratio_largest_vs_baseline": (
            round(largest["daemon_io_bytes_per_peer_round"] / base["daemon_io_bytes_per_peer_round"], 3)
            if largest["daemon_io_bytes_per_peer_round"] and base["daemon_io_bytes_per_peer_round"] else None),
        "overhead_ratio_dht_vs_memory_at_largest": round(
            largest["round_overhead_s_mean"] / max(1e-9, results["memory"][-1]["round_overhead_s_mean"]), 2),
    })


if __name__ == "__main__":
    main()
