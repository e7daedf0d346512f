"""Scale model of the rollout exchange: 8 to 1,000 peers, one index key per window vs the sharded index.

A simulation of hivemind's DHT as the node uses it (no p2pd, no sockets), run round by round:

* Node ids are random 160-bit ids, keys are hivemind's `DHTID.generate(raw key)` (only the top 64
  bits are kept for the XOR metric). Routing tables are Kademlia k-buckets: for each common-prefix
  length with the node's id, up to `bucket_size` (20) random other nodes.
* A record lives on the `num_replicas` (5) nodes nearest to its key (the storing node among them
  if it is one of the nearest), as hivemind's `store_many` places it.
* Lookups follow hivemind's `traverse_dht` with beam 20 and 4 workers (waves of up to 4
  concurrent requests to the nearest unvisited candidates). Every visited node answers with its
  20 nearest neighbours and, when it stores the key, the whole stored value (a dictionary value:
  every peer's subkey). Index reads are `latest` gets (the node asks with
  sufficient_expiration_time=inf, so the search never stops early: all replicas answer); chunk
  reads stop at the wave that found the chunk; a store first runs the same traversal (whose
  replicas also answer with what they hold), then sends the value to the 5 nearest.
* Each round every peer publishes `--groups` groups (one chunk each, the size of a synthetic
  G=8 x 256-token group) and re-stores its index record of the window, then gathers as
  `RolloutExchange.fetch_groups` does: the index keys of the last `staleness + 1` windows (old
  layout) or the read plan of `swarm_node.swarm.index.ShardedIndex` (the node's own code, with
  its level and estimate), then `--max-groups` chunks, at most `--max-per-peer` per peer.
* Status records (reported apart, `status_*`, and in `total_*`): each peer stores its status
  record every `--status-every` rounds (the node's metrics.status_every_steps) under its status
  shard (`--status-shards` keys, the node's `keys.STATUS_SHARDS`; 1: every record under one key,
  the layout before the status keys were sharded), and reads every shard every
  `--status-read-every` rounds. A store's traversal reaches its shard's replicas, and each answers
  with every record that shard holds (up to the storage cap, `--status-cap-*`, per shard).
* Sizes are measured from the real encoders: a RolloutIndex record, a signed owned subkey in a
  hivemind DictionaryDHTValue, neighbour entries; each RPC adds a fixed framing overhead.

Reported per swarm size and layout: mean bytes (sent + received) per node per round, as client
and in all (client + serving); the hottest DHT node's bytes served and requests received per
round; and the payload values a node receives per round (what `traffic["bytes_in"]` counts in
the real transport). The real 2/4/8-peer benchmark (benchmarks/swarm.py) calibrates it: run it
with `--calibrate` and pass the measured JSON line's file with `--measured`.

    python -m benchmarks.scale [--sizes 8 64 256 1000] [--rounds 4] [--measured swarm.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import time
from collections import defaultdict

import numpy as np

from benchmarks.common import emit, parse_args
from benchmarks.scale_dht import BUCKET, SWARM, Dht, Sizes, Traffic
from protocol import keys
from swarm_node.swarm.index import ShardedIndex

__all__ = ["BUCKET", "Dht", "Model", "Sizes", "Traffic"]


class Model:
    """One swarm of `n` peers under one index layout."""

    def __init__(self, n: int, layout: str, args: argparse.Namespace, sizes: Sizes, seed: int) -> None:
        self.n, self.layout, self.args, self.sizes = n, layout, args, sizes
        self.rng = random.Random(seed)
        self.dht = Dht(n, np.random.default_rng(seed), args.replicas)
        self.peer_ids = [f"peer-{seed}-{i}" for i in range(n)]
        self.index = [ShardedIndex(SWARM, p, peers_per_shard=args.peers_per_shard, shards_per_read=args.shards_per_read)
                      for p in self.peer_ids]
        self.store: dict[str, dict[int, int]] = defaultdict(dict)  # index key -> owner -> entries listed
        self.entries: dict[tuple[int, int], int] = defaultdict(int)  # (owner, window) -> groups published
        self.taken: list[set] = [set() for _ in range(n)]
        shards = getattr(args, "status_shards", keys.STATUS_SHARDS)
        if shards & (shards - 1) or not 1 <= shards <= keys.STATUS_SHARDS:
            raise ValueError(f"status shards must be a power of two in [1, {keys.STATUS_SHARDS}], got {shards}")
        self.status_shards = shards
        self.status_shard = [keys.index_shard(p, shards.bit_length() - 1) for p in self.peer_ids]
        self.status_stored: dict[int, set[int]] = defaultdict(set)  # shard -> peers whose record it holds

    def _value_bytes(self, key: str) -> int:
        return sum(self.sizes.record(e) for e in self.store.get(key, {}).values())

    def _find(self, t: Traffic, src: int, key: str, stop_when_found: bool, value_bytes: int) -> bool:
        kid = self.dht.key_id(key)
        holders = self.dht.holders(kid)
        if stop_when_found and src in holders:
            return True  # found in local storage: no traversal
        found = src in holders
        for j, neighbours in self.dht.lookup(src, kid, stop_when_found, cache="/chunk/" not in key):
            down = self.sizes.per_key + neighbours * self.sizes.neighbour + (value_bytes if j in holders else 0)
            t.rpc(src, j, self.sizes.per_key, down)
            found |= j in holders
        return found

    def _store(self, t: Traffic, src: int, key: str, value: int, held: int) -> None:
        self._find(t, src, key, False, held)  # find_nearest_nodes: replicas answer with what they hold
        for j in self.dht.holders(self.dht.key_id(key)):
            if j != src:
                t.rpc(src, j, self.sizes.per_key + value, 8)

    def _chunk_key(self, owner: int, window: int, g: int) -> str:
        return keys.chunk_key(SWARM, hashlib.sha256(f"{self.n}/{owner}/{window}/{g}".encode()).hexdigest())

    def publish(self, t: Traffic, p: int, window: int) -> None:
        before = self.entries[(p, window)]
        for g in range(before, before + self.args.groups):
            self._store(t, p, self._chunk_key(p, window, g), self.sizes.chunk, 0)
        self.entries[(p, window)] = entries = before + self.args.groups
        key = keys.rollout_index_key(SWARM, window) if self.layout == "old" else self.index[p].write_key(window)
        held = self._value_bytes(key)
        self.store[key][p] = entries
        self._store(t, p, key, self.sizes.record(entries), held)

    def gather(self, t: Traffic, p: int, window: int) -> int:
        args = self.args
        windows = range(max(0, window - args.staleness), window + 1)
        if self.layout == "old":
            plan = [(keys.rollout_index_key(SWARM, w), w, None) for w in windows]
        else:
            plan = [(r.key, r.window, r) for r in self.index[p].read_plan(windows, self.rng)]
        records, owners = {}, {}
        for key, w, read in plan:
            value = self._value_bytes(key)
            self._find(t, p, key, False, value)
            t.payload_in[p] += value
            found = self.store.get(key, {})
            if read is not None:
                owners[read] = len(found)
            records.update({(o, w): n for o, n in found.items() if o != p})
        if self.layout == "sharded":
            self.index[p].observe(owners)
        chosen: list[tuple[int, int, int]] = []
        per_peer: dict[int, int] = defaultdict(int)
        for owner, w in self.rng.sample(list(records), len(records)):  # a random order of records
            for g in self.rng.sample(range(records[(owner, w)]), records[(owner, w)]):
                if len(chosen) >= args.max_groups or per_peer[owner] >= args.max_per_peer:
                    break
                if (owner, w, g) not in self.taken[p]:
                    chosen.append((owner, w, g))
                    per_peer[owner] += 1
            if len(chosen) >= args.max_groups:
                break
        for owner, w, g in chosen:
            self.taken[p].add((owner, w, g))
            self._find(t, p, self._chunk_key(owner, w, g), True, self.sizes.chunk)
            t.payload_in[p] += self.sizes.chunk
        return len(chosen)

    def status_records(self, shard: int) -> int:
        """Records a status shard's dictionary value holds: every stored record, up to the
        replicas' storage cap per key (`--status-cap-records` records, `--status-cap-bytes` bytes)."""
        size = self.sizes.status
        cap = min(self.args.status_cap_records, self.args.status_cap_bytes // max(1, size))
        return min(len(self.status_stored[shard]), cap)

    def status(self, t: Traffic, p: int, r: int) -> None:
        """The node's status traffic in round `r`: it stores its record every `--status-every`
        rounds (metrics.status_every_steps) under its own shard and reads every shard every
        `--status-read-every` rounds (the node: every record_ttl_s / 3; one concurrent batch). A
        store first traverses to its shard's replicas, and each replica it asks answers with every
        record of that shard it holds."""
        every, read_every = getattr(self.args, "status_every", 0), getattr(self.args, "status_read_every", 0)
        if every and (r + p) % every == 0:
            shard = self.status_shard[p]
            self._store(t, p, keys.status_key(SWARM, shard), self.sizes.status,
                        self.status_records(shard) * self.sizes.status)
            self.status_stored[shard].add(p)
        if read_every and (r + p) % read_every == 0:
            for shard in range(self.status_shards):
                held = self.status_records(shard) * self.sizes.status
                self._find(t, p, keys.status_key(SWARM, shard), False, held)
                t.payload_in[p] += held

    def run(self, rounds: int, warmup: int) -> dict:
        """`warmup + rounds` rounds. A round is one step of every active peer (the first
        `args.active`, default all); the others step once per window (its first round). A step
        publishes only in the first `args.slots_per_window` rounds of a window (the binding's S;
        default every round), as a node does, and always gathers."""
        rows = []
        rpw = self.args.rounds_per_window
        active = getattr(self.args, "active", None) or self.n
        slots = getattr(self.args, "slots_per_window", None) or rpw
        for r in range(warmup + rounds):
            t, ts = Traffic(self.n), Traffic(self.n)
            window, k = divmod(r, rpw)
            stepping = [p for p in range(self.n) if p < active or k == 0]
            for p in stepping:
                if k < slots:
                    self.publish(t, p, window)
            gathered = [self.gather(t, p, window) for p in stepping]
            for p in stepping:
                self.status(ts, p, r)
            if r >= warmup:
                rows.append((t, statistics.fmean(gathered), ts))
        return self._summary(rows, active)

    def _summary(self, rows: list, active: int) -> dict:
        def mean(f) -> float:
            return statistics.fmean(f(t) for t, _, _ in rows)

        def status_mean(f) -> float:
            return statistics.fmean(f(ts) for _, _, ts in rows)

        def total(t: Traffic, ts: Traffic, part: slice = slice(None)) -> float:
            return float((t.client + t.served + ts.client + ts.served)[part].mean())

        levels = [ix.level for ix in self.index]
        return {
            "peers": self.n, "layout": self.layout,
            "client_bytes_per_node_round": round(mean(lambda t: t.client.mean())),
            "bytes_per_node_round": round(mean(lambda t: (t.client + t.served).mean())),
            "active_bytes_per_node_round": round(mean(lambda t: (t.client + t.served)[:active].mean())),
            # the split a node of another step rate needs (benchmarks.soak): its client traffic is per
            # step (publish, gather), what it serves as a replica and its status traffic per unit of time
            "active_client_bytes_per_node_round": round(mean(lambda t: t.client[:active].mean())),
            "active_served_bytes_per_node_round": round(mean(lambda t: t.served[:active].mean())),
            "active_status_bytes_per_node_round": round(status_mean(lambda ts: (ts.client + ts.served)[:active].mean())),
            "payload_bytes_in_per_node_round": round(mean(lambda t: t.payload_in.mean())),
            "hottest_node_bytes_served_round": round(mean(lambda t: t.served.max())),
            "hottest_node_requests_round": round(mean(lambda t: t.requests.max())),
            "mean_node_requests_round": round(mean(lambda t: t.requests.mean()), 1),
            "groups_gathered_mean": round(statistics.fmean(g for _, g, _ in rows), 2),
            # status records (not the exchange's index): stores and reads of the status shards
            "status_bytes_per_node_round": round(status_mean(lambda ts: (ts.client + ts.served).mean())),
            "status_hottest_node_bytes_served_round": round(status_mean(lambda ts: ts.served.max())),
            "status_records_held": sum(self.status_records(s) for s in self.status_stored),
            "status_payload_bytes_in_per_node_round": round(status_mean(lambda ts: ts.payload_in.mean())),
            "status_records_stored": sum(len(peers) for peers in self.status_stored.values()),
            "total_bytes_per_node_round": round(statistics.fmean(total(t, ts) for t, _, ts in rows)),
            "active_total_bytes_per_node_round": round(statistics.fmean(total(t, ts, slice(0, active))
                                                                        for t, _, ts in rows)),
            "index_levels": None if self.layout == "old" else {str(lv): levels.count(lv) for lv in sorted(set(levels))},
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256, 1000])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per size and layout")
    parser.add_argument("--warmup", type=int, default=3, help="rounds before measuring (index levels settle)")
    parser.add_argument("--rounds-per-window", type=int, default=1,
                        help="rounds in one index window (benchmarks.swarm runs all its rounds in one)")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--max-groups", type=int, default=8)
    parser.add_argument("--max-per-peer", type=int, default=4)
    parser.add_argument("--staleness", type=int, default=4)
    parser.add_argument("--active", type=int, default=None,
                        help="peers that step every round (default all); the rest step once per window")
    parser.add_argument("--slots-per-window", type=int, default=None,
                        help="rounds of a window whose step publishes (swarm.slots_per_window; default every round)")
    parser.add_argument("--status-every", type=int, default=1,
                        help="rounds between a peer's status stores (metrics.status_every_steps; 0: none)")
    parser.add_argument("--status-read-every", type=int, default=0,
                        help="rounds between a peer's reads of the status key (a node: record_ttl_s / 3; 0: none)")
    parser.add_argument("--status-receipts", type=int, default=32, help="receipts in a status record")
    parser.add_argument("--status-shards", type=int, default=keys.STATUS_SHARDS,
                        help="status keys (a power of two, at most keys.STATUS_SHARDS; 1: one key for all records)")
    parser.add_argument("--status-cap-records", type=int, default=256, help="swarm.max_subkeys_per_key (per shard)")
    parser.add_argument("--status-cap-bytes", type=int, default=256 << 10, help="swarm.max_bytes_per_key (per shard)")
    parser.add_argument("--replicas", type=int, default=5)
    parser.add_argument("--peers-per-shard", type=int, default=16)
    parser.add_argument("--shards-per-read", type=int, default=2)
    parser.add_argument("--layouts", nargs="+", default=["old", "sharded"], choices=["old", "sharded"])
    parser.add_argument("--measured", help="file whose last line is benchmarks.swarm's JSON: compare per peers")
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, {"sizes": [8, 64], "rounds": 1, "warmup": 1})

    sizes = Sizes.measure(receipts=args.status_receipts)
    print("sizes", vars(sizes), flush=True)
    results = []
    for n in args.sizes:
        for layout in args.layouts:
            t0 = time.perf_counter()
            res = Model(n, layout, args, sizes, args.seed + n).run(args.rounds, args.warmup)
            res["sim_seconds"] = round(time.perf_counter() - t0, 1)
            results.append(res)
            print(res, flush=True)
    out = {"benchmark": "scale", "config": vars(args), "sizes": vars(sizes), "results": results}
    out.update(_ratios(results, args.sizes))
    if args.measured:
        out["calibration"] = _calibrate(args.measured, results)
    emit(out)


def _ratios(results: list[dict], sizes: list[int]) -> dict:
    by = {(r["layout"], r["peers"]): r for r in results}
    out = {}
    big = max(sizes)
    mid = [n for n in sizes if n >= 64]
    for layout in ("old", "sharded"):
        if (layout, big) in by and mid and (layout, mid[0]) in by and mid[0] != big:
            a, b = by[(layout, mid[0])], by[(layout, big)]
            out[f"{layout}_bytes_per_node_ratio_{big}_vs_{mid[0]}"] = round(
                b["bytes_per_node_round"] / a["bytes_per_node_round"], 3)
            out[f"{layout}_hottest_bytes_ratio_{big}_vs_{mid[0]}"] = round(
                b["hottest_node_bytes_served_round"] / a["hottest_node_bytes_served_round"], 3)
    flat = out.get(f"sharded_bytes_per_node_ratio_{big}_vs_{mid[0]}") if mid else None
    if flat is not None:
        out["goal_sharded_bytes_per_node_within_1_5x"] = flat <= 1.5
    if ("old", big) in by and ("sharded", big) in by:
        out[f"hottest_bytes_old_vs_sharded_at_{big}"] = round(
            by[("old", big)]["hottest_node_bytes_served_round"] / by[("sharded", big)]["hottest_node_bytes_served_round"], 2)
    return out


def _calibrate(path: str, results: list[dict]) -> list[dict]:
    """Measured (benchmarks.swarm, real DHT) vs simulated bytes per node per round, per swarm size.

    The p2p daemon's read+write syscall bytes count each network byte about twice (socket and
    the unix socket to the DHT process), so half of them is compared with the simulated bytes.
    """
    with open(path) as f:
        measured = json.loads(f.read().strip().splitlines()[-1])
    out = []
    for row in measured["dht"]:
        sim = [r for r in results if r["peers"] == row["peers"]]
        for r in sim:
            daemon = row.get("daemon_io_bytes_per_peer_round")
            out.append({
                "peers": row["peers"], "layout": r["layout"],
                "measured_network_bytes_per_node_round": None if daemon is None else daemon // 2,
                "simulated_bytes_per_node_round": r["bytes_per_node_round"],
                "measured_payload_in": row["payload_bytes_in_per_peer_round"],
                "simulated_payload_in": r["payload_bytes_in_per_node_round"],
            })
    return out


if __name__ == "__main__":
    main()
