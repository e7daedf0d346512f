"""A hostile peer for the red-team suite, written against the wire and the DHT only.

It runs its own hivemind DHT (a plain `hivemind.DHT`), makes its own RSA identities, encodes
messages with the public wire format (`protocol`) and stores records by sending hivemind store RPCs
to the other peers itself, signed per identity; it never imports the node's code (the one rule it
borrows is the public prompt-assignment function, `select_prompts`, which docs/method.md makes
part of the protocol; the prompt binding of docs/architecture.md says which of its prompts a window
assigns). Run as `python -m tests.integration.redteam_attacker --initial-peer ...`;
it reads one JSON command per line on stdin and answers one JSON line on stdout.

Commands: {"op": "attack", "name": ..., "ctx": {...}} where ctx carries what any peer can learn
(swarm id, window length, staleness, prompts a step and slots a window, prompt set id, problems'
sha256 and answers, the tokenizer fingerprint, vocabulary size, G, max tokens, and token ids of texts
under that tokenizer); {"op": "quit"}.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import pickle
import re
import sys
import tempfile
import time
from functools import partial
from typing import Any

import hivemind
import numpy as np
from cryptography.hazmat.primitives import serialization
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from protocol import codec, keys
from protocol.messages import (
    Completion,
    IndexEntry,
    NodeStatus,
    PromptRef,
    RolloutGroup,
    RolloutIndex,
    SamplingParams,
)
from protocol.validate import MIN_LOGPROB
from protocol.binding import select_prompts
from tests.integration import redteam_forge as forge

ser = DHTProtocol.serializer
_SIGNATURE = re.compile(rb"\[signature:.+\]$", re.DOTALL)


_KEY_POOL: list[RSAPrivateKey] = []  # keys made before the attacks (RSA key generation is slow)


class Identity:
    """One attacker identity: an RSA key, its owner subkey and its libp2p peer id."""

    def __init__(self) -> None:
        self.key = _KEY_POOL.pop() if _KEY_POOL else RSAPrivateKey()
        self.signer = RSASignatureValidator(self.key)
        self.subkey = self.signer.local_public_key
        der = self.key.get_public_key()._public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        proto = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
        self.peer_id = PeerID(bytes([0x12, 0x20]) + hashlib.sha256(proto).digest()).to_base58()

    def signed(self, key: str, value: bytes, expiration: float) -> bytes:
        record = DHTRecord(DHTID.generate(source=key).to_bytes(), ser.dumps(self.subkey), ser.dumps(value), expiration)
        return self.signer.sign_value(record)


async def _raw_store(_dht: Any, node: Any, path: str, timeout: float) -> list[int]:
    """In the DHT process: send each (key, subkey, value bytes, expiration) pickled at `path` to the
    peers nearest its key (never to ourselves); returns how many peers accepted each item. (The items
    travel by file: hivemind's command pipe fails on messages larger than the pipe buffer.)"""
    with open(path, "rb") as f:
        items = pickle.load(f)
    ids = [DHTID.generate(source=k) for k, _, _, _ in items]
    nearest = await node.find_nearest_nodes(set(ids), k_nearest=node.num_replicas, exclude_self=True)
    known = set(node.protocol.routing_table.uid_to_peer_id.values())  # a flood goes to everyone we know
    batches: list[tuple[Any, list[int]]] = []  # (peer, items) under 1 MiB a request (hivemind's limit is 2 MiB)
    open_batch: dict[Any, tuple[list[int], int]] = {}
    for i, key_id in enumerate(ids):
        for peer in set(nearest.get(key_id, {}).values()) | known:
            idx, size = open_batch.get(peer, ([], 0))
            if idx and size + len(items[i][2]) > (1 << 20):
                batches.append((peer, idx))
                idx, size = [], 0
            open_batch[peer] = (idx + [i], size + len(items[i][2]))
    batches += [(peer, idx) for peer, (idx, _) in open_batch.items()]
    accepted = [0] * len(items)

    async def send(peer: Any, idx: list[int]) -> None:
        ok = await node.protocol.call_store(peer, [ids[i] for i in idx], [items[i][2] for i in idx],
                                            [items[i][3] for i in idx], subkeys=[items[i][1] for i in idx])
        for i, good in zip(idx, ok or []):
            accepted[i] += int(bool(good))

    await asyncio.wait_for(asyncio.gather(*(send(p, idx) for p, idx in batches), return_exceptions=True), timeout)
    return accepted


class Attacker:
    def __init__(self, initial_peers: list[str]) -> None:
        # Our own replica validates nothing but signatures (so values read back can be stripped).
        self.dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True,
                                record_validators=[RSASignatureValidator(RSAPrivateKey())])

    # ---- wire helpers ----------------------------------------------------------------------

    def store(self, items: list) -> list[int]:
        with tempfile.NamedTemporaryFile(suffix=".pkl") as f:
            pickle.dump(items, f)
            f.flush()
            return self.dht.run_coroutine(partial(_raw_store, path=f.name, timeout=20.0))

    def owned(self, ident: Identity, key: str, value: bytes, expiration: float) -> tuple:
        return key, ident.subkey, ident.signed(key, value, expiration), expiration

    @staticmethod
    def chunk(swarm: str, data: bytes, expiration: float) -> tuple:
        return keys.chunk_key(swarm, codec.content_digest(data)), None, ser.dumps(data), expiration

    def publish(self, ident: Identity, ctx: dict, groups: list[RolloutGroup], window: int) -> dict:
        """Chunks plus this identity's index record for `window`, as an honest node lays them out."""
        exp = get_dht_time() + 60
        items, entries = [], []
        for g in groups:
            data = codec.encode(g, limits=codec.Limits(max_completions=256))
            chunks = codec.split_chunks(data, 512 << 10)
            items += [self.chunk(ctx["swarm"], c, exp) for c in chunks]
            entries.append(IndexEntry(chunk_digests=tuple(codec.content_digest(c) for c in chunks), size=len(data),
                                      prompt_index=g.prompt.index, policy_version=g.policy_version,
                                      created_at=g.created_at))
        index = codec.encode(RolloutIndex(sender=ident.peer_id, window=window, entries=tuple(entries)))
        items.append(self.owned(ident, keys.rollout_index_key(ctx["swarm"], window), index, exp))
        accepted = self.store(items)
        return {"index_accepted": accepted[-1], "chunks_accepted": min(accepted[:-1] or [0])}

    def read_groups(self, ctx: dict, window: int) -> list[RolloutGroup]:
        """Every group listed under a window's index key (for replays)."""
        found = self.dht.get(keys.rollout_index_key(ctx["swarm"], window), latest=True)
        out = []
        if found is None or not isinstance(found.value, dict):
            return out
        for item in found.value.values():
            value = item.value if isinstance(item.value, bytes) else b""
            try:
                index = codec.decode(value)
            except Exception:
                try:  # a value whose signature our validator did not strip
                    index = codec.decode(ser.loads(_SIGNATURE.sub(b"", value)))
                except Exception:
                    continue
            for e in getattr(index, "entries", ()):
                parts = [self.dht.get(keys.chunk_key(ctx["swarm"], d)) for d in e.chunk_digests]
                if all(p is not None for p in parts):
                    out.append(codec.decode(b"".join(p.value for p in parts)))
        return out

    # ---- groups ----------------------------------------------------------------------------

    @staticmethod
    def assigned(ident: Identity, ctx: dict, window: int) -> list[int]:
        """The prompts the binding assigns `ident` in `window`: the first n x S of select_prompts."""
        return select_prompts(ident.peer_id, window, ctx["prompts_per_step"] * ctx["slots_per_window"],
                              ctx["set_size"], salt=ctx["swarm"])

    @staticmethod
    def group(ident: Identity, ctx: dict, version: int, *, index: int | None = None, g: int | None = None,
              tokens: list[list[int]] | None = None, logprob: float = -1.0, n_tokens: int | None = None,
              seed: int = 0, created_at: float | None = None) -> RolloutGroup:
        """A well-formed group of `ident` at `version`, made at `created_at` (default: the attack's
        time), on a prompt the window assigns it (one per version) unless `index` is given."""
        size = ctx["set_size"]
        created_at = ctx["now"] if created_at is None else created_at
        if index is None:
            mine = Attacker.assigned(ident, ctx, keys.window_of(created_at, ctx["window_seconds"]))
            index = mine[version % len(mine)]
        g = ctx["group_size"] if g is None else g
        rng = np.random.default_rng(seed)
        n_tokens = n_tokens or ctx["max_new_tokens"]
        if tokens is None:
            tokens = [rng.integers(3, ctx["vocab"], n_tokens).tolist() for _ in range(g)]
        comps = tuple(Completion(token_ids=np.asarray(t, np.uint32), logprobs=np.full(len(t), logprob, np.float32),
                                 finish_reason="stop", claimed_reward=1.0) for t in tokens)
        return RolloutGroup(
            swarm_id=ctx["swarm"], sender=ident.peer_id, model_id="tiny", model_revision="",
            tokenizer_fingerprint=ctx["fingerprint"], policy_version=version, created_at=created_at,
            prompt=PromptRef(prompt_set_id=ctx["prompt_set_id"], index=index, sha256=ctx["shas"][index]),
            sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=ctx["max_new_tokens"]),
            completions=comps)

    # ---- attacks ---------------------------------------------------------------------------

    def attack(self, name: str, ctx: dict) -> dict:
        ctx = {**ctx, "now": get_dht_time()}  # one time for the attack: its groups' created_at and window
        window = keys.window_of(ctx["now"], ctx["window_seconds"])
        versions = range(1000, 1000 + ctx.get("groups_per_identity", 4))
        out: dict[str, Any] = {"identities": []}

        def run_with(n_ids: int, make) -> None:
            results = []
            for _ in range(n_ids):
                ident = Identity()
                out["identities"].append(ident.peer_id)
                results.append(self.publish(ident, ctx, [make(ident, v) for v in versions], window))
            out["index_accepted"] = out.get("index_accepted", 0) + sum(r["index_accepted"] > 0 for r in results)

        if name == "poisoned_logprobs":
            run_with(1, lambda i, v: self.group(i, ctx, v, logprob=-90.0, seed=v))
            run_with(1, lambda i, v: self.group(i, ctx, v, logprob=-20.0, seed=v + 7))
        elif name == "oversized_groups":
            run_with(2, lambda i, v: self.group(i, ctx, v, g=256, seed=v))
        elif name == "tiny_groups":
            run_with(2, lambda i, v: self.group(i, ctx, v, g=1 + v % 2, seed=v))
        elif name == "verifier_bomb":
            bombs = ctx["texts"]["bombs"]
            run_with(2, lambda i, v: self.group(i, ctx, v, tokens=[bombs[(v + k) % len(bombs)] for k in range(
                ctx["group_size"])], logprob=-0.5))
        elif name == "cherry_picked_prompts":
            easy = ctx["easy_index"]

            def cherry(i: Identity, v: int) -> RolloutGroup:
                mine = self.assigned(i, ctx, window)
                return self.group(i, ctx, v, index=next(k for k in range(easy, easy + len(mine) + 1) if k not in mine),
                                  seed=v)
            run_with(2, cherry)
        elif name == "version_grinding":
            out.update(self.grind_versions(ctx, window, out["identities"]))
        elif name == "hedged_answers":
            def hedged(i: Identity, v: int) -> RolloutGroup:
                g = self.group(i, ctx, v, seed=v)
                texts = ctx["texts"]["hedged"][str(g.prompt.index)] if str(g.prompt.index) in ctx["texts"]["hedged"] \
                    else None
                return g if texts is None else self.group(i, ctx, v, tokens=texts, logprob=-0.5)
            run_with(2, hedged)
        elif name == "replay":
            honest, deadline = [], time.monotonic() + 20
            while not honest and time.monotonic() < deadline:  # reads can come back empty under load
                honest = [g for w in range(window - 2, window + 1) for g in self.read_groups(ctx, w)]
                honest = [g for g in honest if g.sender in ctx["honest_peers"]]
            out["replayed"] = len(honest)
            # Groups at least half of whose completions have >= 16 tokens: the length from which a
            # completion is a fingerprint to the replay rule (shorter answers recur honestly).
            out["replayed_fingerprinted"] = sum(2 * sum(len(c.token_ids) >= 16 for c in g.completions)
                                                >= len(g.completions) for g in honest[:8])
            ident = Identity()
            out["identities"].append(ident.peer_id)
            replays = []
            for k, g in enumerate(honest[:8]):  # the honest completions, on prompts assigned to us
                mine = self.group(ident, ctx, 1000 + k)
                replays.append(dataclasses.replace(g, sender=ident.peer_id, policy_version=1000 + k,
                                                   created_at=ctx["now"], prompt=mine.prompt))
            out["index_accepted"] = int(bool(replays)) and int(self.publish(ident, ctx, replays, window)["index_accepted"] > 0)
        elif name == "sybil_share":
            run_with(15, lambda i, v: self.group(i, ctx, v, seed=v))
        elif name == "flood":
            out.update(self.flood(ctx, window))
        elif name in ("forged_floor_logprobs", "forged_certain_logprobs"):
            # Every token's logprob just above the protocol's floor (the sampled tokens look wildly
            # improbable: importance weight pi/pi_gen at its clamp), or 0 (certain: weight <= 1).
            lp = MIN_LOGPROB + 0.1 if name == "forged_floor_logprobs" else 0.0
            run_with(2, lambda i, v: forge.learnable_group(i, ctx, v, self.assigned(i, ctx, window)[v % 4], lp))
        elif name == "forged_floor_declared":
            # The same forgery, declaring the public warm model the honest nodes hold as a reference
            # (swarm.spot_check.reference_models): their spot check recomputes a few logprobs.
            model = (ctx["reference_model"], ctx["reference_revision"])
            run_with(2, lambda i, v: forge.learnable_group(i, ctx, v, self.assigned(i, ctx, window)[v % 4],
                                                           MIN_LOGPROB + 0.1, model))
        elif name == "crosstok_malformed":
            for kind in forge.FOREIGN_KINDS:  # one identity per kind
                run_with(1, lambda i, v, kind=kind: forge.foreign_group(i, ctx, v, self.assigned(i, ctx, window)[v % 4],
                                                                        kind))
        elif name == "crosstok_certain":
            run_with(2, lambda i, v: forge.foreign_group(i, ctx, v, self.assigned(i, ctx, window)[v % 4], "valid",
                                                         logprob=0.0))
        elif name == "sybil_index":
            idents = [Identity() for _ in range(ctx["sybil_identities"])]
            out["identities"] += [i.peer_id for i in idents]
            live = keys.window_of(get_dht_time(), ctx["window_seconds"])  # after the keys were made
            accepted = self.store(forge.sybil_index_items(self, idents, ctx, range(live, live + 3)))
            out.update(sybil_records=len(accepted), sybil_accepted_replicas=sum(accepted),
                       sybil_stored=sum(a > 0 for a in accepted))
        else:
            raise ValueError(f"unknown attack {name}")
        return out

    def grind_versions(self, ctx: dict, window: int, identities: list[str]) -> dict:
        """Issue 21's attack: grind `policy_version` until `select_prompts(sender, version)`, the rule
        before the binding, assigns an easy prompt, and publish groups on it at those versions, in
        every window peers read (created_at in each), for identities whose window assignments in
        that band do not hold the prompt (where one does, the prompt is simply theirs)."""
        n, size, ws, stale = ctx["prompts_per_step"], ctx["set_size"], ctx["window_seconds"], ctx["staleness_windows"]
        tries, published, accepted = 0, 0, 0
        for _ in range(2):
            ident = Identity()
            identities.append(ident.peer_id)
            # Not assigned in any window the groups may land in (one more than the tolerance: the
            # grinding and the stores take time, and the live window is taken again before publishing).
            legit = {i for w in range(window - stale, window + 2) for i in self.assigned(ident, ctx, w)}
            target = next(i for i in ctx["easy_indices"] if i not in legit)
            versions, v = [], 1000
            while len(versions) < ctx["groups_per_identity"]:
                tries += 1
                if target in select_prompts(ident.peer_id, v, n, size, salt=ctx["swarm"]):
                    versions.append(v)
                v += 1
            now = get_dht_time()  # windows are a few seconds long: stamp the groups in the live ones
            live = keys.window_of(now, ws)
            for w in range(max(live - stale, window - stale), min(live, window + 1) + 1):
                created = now - (live - w) * ws  # the same ground versions in each window of the tolerance
                groups = [self.group(ident, ctx, v, index=target, seed=v + 7919 * w, created_at=created)
                          for v in versions]
                accepted += self.publish(ident, ctx, groups, w)["index_accepted"] > 0
                published += len(groups)
        return {"grind_tries": tries, "ground_groups": published, "index_accepted": accepted}

    def flood(self, ctx: dict, window: int) -> dict:
        """64 identities x ~64 KiB records into the live index keys, plus far-future and foreign-key writes."""
        idents = [Identity() for _ in range(64)]
        now, swarm = get_dht_time(), ctx["swarm"]
        window = keys.window_of(now, ctx["window_seconds"])  # the live window, after the slow key generation
        items = []
        for w in (window, window + 1):
            for ident in idents:
                index = self._big_index(ident, w, now)
                items.append(self.owned(ident, keys.rollout_index_key(swarm, w), index, now + 60))
        accepted = self.store(items)
        ghost = idents[0]
        status = codec.encode(NodeStatus(peer_id=ghost.peer_id, role="trainer", model_id="ghost", step=999999,
                                         timestamp=now))
        far = self.store([self.owned(ghost, keys.status_key(swarm, keys.status_shard(ghost.peer_id)), status,
                                     now + 1e8)])
        garbage = self.store([self.owned(ghost, keys.rollout_index_key(swarm, window), b"\x00" * (60 << 10), now + 60)])
        foreign = self.store([
            self.owned(ghost, keys.rollout_index_key("another-swarm", window),
                       codec.encode(RolloutIndex(sender=ghost.peer_id, window=window, entries=())), now + 60),
            self.owned(ghost, "any/key/at/all", status, now + 60),
        ])
        return {"identities": [i.peer_id for i in idents], "flood_records": len(items),
                "flood_accepted_replicas": sum(accepted), "flood_record_bytes": len(items[0][2]),
                "far_future_accepted": far[0], "garbage_accepted": garbage[0], "foreign_accepted": sum(foreign)}


    @staticmethod
    def _big_index(ident: Identity, window: int, now: float, target: int = 62 << 10) -> bytes:
        """A well-formed RolloutIndex of just under 64 KiB, listing chunks nobody stored."""
        entries: list[IndexEntry] = []
        while True:
            k = len(entries)
            digests = tuple(hashlib.sha256(f"{ident.peer_id}:{window}:{k}:{j}".encode()).hexdigest() for j in range(120))
            candidate = entries + [IndexEntry(chunk_digests=digests, size=8 << 20, prompt_index=k, policy_version=k,
                                              created_at=now)]
            data = codec.encode(RolloutIndex(sender=ident.peer_id, window=window, entries=tuple(candidate)))
            if len(data) > target:
                return codec.encode(RolloutIndex(sender=ident.peer_id, window=window, entries=tuple(entries)))
            entries = candidate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--initial-peer", action="append", required=True)
    parser.add_argument("--identities", type=int, default=170, help="RSA keys to make before the attacks")
    args = parser.parse_args()
    attacker = Attacker(args.initial_peer)
    _KEY_POOL.extend(RSAPrivateKey() for _ in range(args.identities))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        t0 = time.perf_counter()
        try:
            result = attacker.attack(cmd["name"], cmd["ctx"])
        except Exception as e:  # report to the test, keep serving
            result = {"error": f"{type(e).__name__}: {e}"}
        result["seconds"] = time.perf_counter() - t0
        print(json.dumps(result), flush=True)
    attacker.dht.shutdown()


if __name__ == "__main__":
    main()
