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
from dataclasses import dataclass

import numpy as np
from hivemind.dht.routing import DHTID

from benchmarks.common import emit, parse_args
from protocol import codec, keys
from protocol.messages import IndexEntry, RolloutIndex
from swarm_node.swarm.index import ShardedIndex
from swarm_node.swarm.synthetic import synthetic_group

SWARM = "scale"
BUCKET = 20
WORKERS = 4
RPC_OVERHEAD = 160  # bytes per request/response pair: libp2p stream setup and framing, protobuf headers


@dataclass
class Sizes:
    """Byte sizes measured from the real encoders."""

    chunk: int  # one encoded group (one chunk)
    record_lengths: list[int]  # encoded RolloutIndex with 0, 1, 2, ... entries
    subkey_overhead: int  # signed owned subkey, signature and expiration around a record in a dict value
    neighbour: int  # one (node id, peer id) pair in a find result
    per_key: int  # key id and result framing per key in a request/response

    @classmethod
    def measure(cls, max_entries: int = 64, tokens: int = 256) -> Sizes:
        """Sizes of the real encoders' output; `tokens`: completion length of the synthetic group."""
        from hivemind.dht.crypto import RSASignatureValidator
        from hivemind.dht.protocol import DHTProtocol
        from hivemind.dht.storage import DictionaryDHTValue
        from hivemind.dht.validation import DHTRecord
        from hivemind.utils import get_dht_time
        from hivemind.utils.crypto import RSAPrivateKey

        rng = np.random.default_rng(0)
        group = synthetic_group(rng, swarm_id=SWARM, sender="x" * 52, created_at=3e6, prompt_index=1,
                                policy_version=1, group_size=8, tokens=tokens)
        chunk = len(codec.encode(group))
        entries = tuple(IndexEntry(chunk_digests=(hashlib.sha256(bytes([i])).hexdigest(),), size=chunk + i,
                                   prompt_index=12345 + i, policy_version=100, created_at=3e6 + i * 0.123456)
                        for i in range(max_entries + 1))
        lengths = [len(codec.encode(RolloutIndex(sender="Qm" + "x" * 44, window=100_000, entries=entries[:n])))
                   for n in range(max_entries + 1)]
        ser = DHTProtocol.serializer
        signers = [RSASignatureValidator(RSAPrivateKey()) for _ in range(2)]
        record = codec.encode(RolloutIndex(sender="Qm" + "x" * 44, window=100_000, entries=entries[:1]))

        expiration = get_dht_time() + 300

        def dict_value(n_subkeys: int) -> int:
            value = DictionaryDHTValue()
            for v in signers[:n_subkeys]:
                rec = DHTRecord(key=b"k" * 20, subkey=ser.dumps(v.local_public_key), value=ser.dumps(record),
                                expiration_time=expiration)
                value.store(rec.subkey, v.sign_value(rec), expiration)
            return len(ser.dumps(value))

        return cls(chunk=chunk, record_lengths=lengths, subkey_overhead=dict_value(2) - dict_value(1) - len(record),
                   neighbour=20 + 34 + 4, per_key=20 + 16)

    def record(self, entries: int) -> int:
        """Bytes of one peer's record with `entries` entries inside a dictionary value."""
        lengths = self.record_lengths
        if entries < len(lengths):
            return self.subkey_overhead + lengths[entries]
        return self.subkey_overhead + lengths[-1] + (entries - len(lengths) + 1) * (lengths[-1] - lengths[-2])


class Dht:
    """Replica placement, routing tables and lookups; counts every request in `Traffic`."""

    def __init__(self, n: int, rng: np.random.Generator, replicas: int) -> None:
        self.n, self.replicas = n, replicas
        self.ids = rng.integers(0, 2**63, size=n, dtype=np.uint64) * np.uint64(2) + rng.integers(
            0, 2, size=n, dtype=np.uint64)
        self.tables = [self._table(i, rng) for i in range(n)]
        self._key_ids: dict[str, np.uint64] = {}
        self._holders: dict[np.uint64, frozenset[int]] = {}
        self._nearest: dict[tuple[int, np.uint64], np.ndarray] = {}

    def _table(self, i: int, rng: np.random.Generator) -> np.ndarray:
        others = np.delete(np.arange(self.n), i)
        dist = self.ids[others] ^ self.ids[i]
        bucket = 63 - np.floor(np.log2(dist.astype(np.float64))).astype(int)  # common prefix length
        kept = []
        for b in np.unique(bucket):
            members = others[bucket == b]
            kept.extend(rng.choice(members, size=min(BUCKET, len(members)), replace=False))
        return np.array(kept, dtype=np.int64)

    def key_id(self, key: str) -> np.uint64:
        kid = self._key_ids.get(key)
        if kid is None:
            kid = self._key_ids[key] = np.uint64(DHTID.generate(source=key) >> 96)
        return kid

    def holders(self, kid: np.uint64) -> frozenset[int]:
        """The nodes that store a key: its `replicas` nearest nodes."""
        h = self._holders.get(kid)
        if h is None:
            h = self._holders[kid] = frozenset(np.argsort(self.ids ^ kid)[: self.replicas].tolist())
        return h

    def nearest(self, node: int, kid: np.uint64, cache: bool) -> np.ndarray:
        """The `BUCKET` nodes of `node`'s routing table nearest to `kid` (what it answers a find with)."""
        near = self._nearest.get((node, kid)) if cache else None
        if near is None:
            table = self.tables[node]
            near = table[np.argsort(self.ids[table] ^ kid)[:BUCKET]]
            if cache:
                self._nearest[(node, kid)] = near
        return near

    def lookup(self, src: int, kid: np.uint64, stop_when_found: bool, cache: bool) -> list[tuple[int, int]]:
        """(node, neighbours it answered with) for each node a traversal from `src` visits, in order
        (hivemind's traverse_dht, in waves)."""
        holders = self.holders(kid)
        dist = {int(j): int(self.ids[j] ^ kid) for j in self.nearest(src, kid, cache)}
        visited, order = {src}, []
        while True:
            beam = sorted(dist.values())[:BUCKET]
            bound = beam[-1] if len(beam) >= BUCKET else None
            wave = [j for j in sorted(dist, key=dist.get) if j not in visited
                    and (bound is None or dist[j] <= bound)][:WORKERS]
            if not wave:
                return order
            for j in wave:
                visited.add(j)
                near = self.nearest(j, kid, cache)
                order.append((j, len(near)))
                for m in near:
                    m = int(m)
                    if m != src and m not in dist:
                        dist[m] = int(self.ids[m] ^ kid)
            if stop_when_found and any(j in holders for j in wave):
                return order


class Traffic:
    def __init__(self, n: int) -> None:
        self.client = np.zeros(n)  # bytes a node sends and receives for its own calls
        self.served = np.zeros(n)  # bytes a node receives and sends answering others
        self.requests = np.zeros(n)  # requests a node answers
        self.payload_in = np.zeros(n)  # values handed to the node (as the transport counts them)

    def rpc(self, src: int, dst: int, up: int, down: int) -> None:
        total = up + down + RPC_OVERHEAD
        self.client[src] += total
        self.served[dst] += total
        self.requests[dst] += 1


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
            t = Traffic(self.n)
            window, k = divmod(r, rpw)
            stepping = [p for p in range(self.n) if p < active or k == 0]
            for p in stepping:
                if k < slots:
                    self.publish(t, p, window)
            gathered = [self.gather(t, p, window) for p in stepping]
            if r >= warmup:
                rows.append((t, statistics.fmean(gathered)))
        return self._summary(rows, active)

    def _summary(self, rows: list, active: int) -> dict:
        def mean(f) -> float:
            return statistics.fmean(f(t) for t, _ in rows)

        levels = [ix.level for ix in self.index]
        return {
            "peers": self.n, "layout": self.layout,
            "client_bytes_per_node_round": round(mean(lambda t: t.client.mean())),
            "bytes_per_node_round": round(mean(lambda t: (t.client + t.served).mean())),
            "active_bytes_per_node_round": round(mean(lambda t: (t.client + t.served)[:active].mean())),
            "payload_bytes_in_per_node_round": round(mean(lambda t: t.payload_in.mean())),
            "hottest_node_bytes_served_round": round(mean(lambda t: t.served.max())),
            "hottest_node_requests_round": round(mean(lambda t: t.requests.max())),
            "mean_node_requests_round": round(mean(lambda t: t.requests.mean()), 1),
            "groups_gathered_mean": round(statistics.fmean(g for _, g in rows), 2),
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
    parser.add_argument("--replicas", type=int, default=5)
    parser.add_argument("--peers-per-shard", type=int, default=16)
    parser.add_argument("--shards-per-read", type=int, default=2)
    parser.add_argument("--layouts", nargs="+", default=["old", "sharded"], choices=["old", "sharded"])
    parser.add_argument("--measured", help="file whose last line is benchmarks.swarm's JSON: compare per peers")
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, {"sizes": [8, 64], "rounds": 1, "warmup": 1})

    sizes = Sizes.measure()
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
