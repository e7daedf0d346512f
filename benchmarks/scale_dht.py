"""The DHT of the scale model (`benchmarks.scale`): record sizes measured from the real encoders,
replica placement, Kademlia routing tables and hivemind's traversal, and the bytes each RPC costs."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import numpy as np
from hivemind.dht.routing import DHTID

from protocol import codec
from protocol.messages import MAX_RECEIPTS, IndexEntry, NodeStatus, Receipt, RolloutIndex
from swarm_node.swarm.synthetic import synthetic_group

SWARM = "scale"
BUCKET = 20
WORKERS = 4
RPC_OVERHEAD = 160  # bytes per request/response pair: libp2p stream setup and framing, protobuf headers
STATUS_METRICS = 110  # finite metrics a tiny node's status record carries (a step's row through status_metrics)


def _peer_id(rng: random.Random) -> str:
    return "Qm" + "".join(rng.choice("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz") for _ in range(44))


def status_record_bytes(receipts: int, seed: int = 0) -> int:
    """Encoded bytes of a trainer's status record: STATUS_METRICS metrics, one address, and
    `receipts` receipts for distinct senders (random peer ids, counts and two drop reasons each)."""
    rng = random.Random(seed)
    me = _peer_id(rng)
    metrics = {f"metric_{i:03d}_{'x' * (i % 20)}": rng.random() * 10 ** rng.randint(0, 6) for i in range(STATUS_METRICS)}
    rec = []
    for _ in range(receipts):
        samples = rng.randint(8, 4000)
        filtered = rng.randint(0, samples // 2)
        rec.append(Receipt(sender=_peer_id(rng), taken=samples // 8, samples=samples,
                           gradient=rng.randint(0, samples - filtered), filtered=filtered,
                           filtered_advantage=rng.randint(0, filtered), filtered_kl=rng.randint(0, filtered),
                           dropped=(("duplicate", rng.randint(1, 50)), ("unknown_prompt", rng.randint(1, 500)))))
    status = NodeStatus(peer_id=me, role="trainer", model_id="tiny-random:64x2:a", step=rng.randint(1, 10**5),
                        timestamp=3e6 + rng.random(), maddrs=(f"/ip4/10.0.0.1/tcp/4444/p2p/{me}",), metrics=metrics,
                        tokenizer_fingerprint=hashlib.sha256(b"t").hexdigest(), receipts_span_s=300.0,
                        receipts=tuple(rec))
    return len(codec.encode(status))


@dataclass
class Sizes:
    """Byte sizes measured from the real encoders."""

    chunk: int  # one encoded group (one chunk)
    record_lengths: list[int]  # encoded RolloutIndex with 0, 1, 2, ... entries
    subkey_overhead: int  # signed owned subkey, signature and expiration around a record in a dict value
    neighbour: int  # one (node id, peer id) pair in a find result
    per_key: int  # key id and result framing per key in a request/response
    status: int = 0  # one node's status record (NodeStatus with receipts) inside a dictionary value

    @classmethod
    def measure(cls, max_entries: int = 64, tokens: int = 256, receipts: int = MAX_RECEIPTS) -> Sizes:
        """Sizes of the real encoders' output; `tokens`: completion length of the synthetic group;
        `receipts`: senders a status record has receipts for (the node's default, at most)."""
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

        overhead = dict_value(2) - dict_value(1) - len(record)
        return cls(chunk=chunk, record_lengths=lengths, subkey_overhead=overhead,
                   neighbour=20 + 34 + 4, per_key=20 + 16, status=overhead + status_record_bytes(receipts))

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
