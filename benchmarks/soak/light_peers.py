"""Light peers for the soak: many DHT peers in one process, no torch, publishing valid groups.

`python -m benchmarks.soak.light_peers SPEC.json` starts `count` full (not client-mode) hivemind
DHT nodes on one event loop of this process (hivemind loaded without torch, as `swarm-node status`
loads it: `swarm.patches.load_light_hivemind`), each with its own RSA identity and p2p daemon, the
same record validators and storage caps as a node's DHT, so each is a real replica of the swarm's
records. Every DHT window each light peer, like a training node's first step of the window:

* takes the prompts the protocol's binding assigns to it (`protocol.binding.window_prompts`, slot 0)
  from the prompt set the harness names in the spec's `prompt_file` (re-read every window, so an
  operator's switch to a successor set reaches the light peers too);
* publishes one group per prompt through the node's own `RolloutExchange`: G completions
  `\\boxed{N}` in the byte-level tokenizer of the tiny models (variant a: the spec's `char_ids`
  maps each printable ASCII character to its token, then eos), about half of them right, with
  text and piece lengths so receivers of other tokenizers can take them;
* gathers peers' groups as a node does (index plan, at most `max_groups` chunks), so every peer
  loads the DHT as the scale model assumes;
* publishes a status record (role `trainer`, model `soak/light-peer`, its counters).

Each publish and gather is one JSON line in `<out>/light-<k>.jsonl` (time, peer, groups, bytes, and
the sender and creation time of every group taken).
The process stops at `stop_at` (wall clock) or on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from swarm_node.swarm.patches import load_light_hivemind

load_light_hivemind()  # before anything imports hivemind: no torch in this process

from protocol import keys  # noqa: E402
from protocol.binding import window_prompts  # noqa: E402
from protocol.messages import Completion, NodeStatus, PromptRef, RolloutGroup, SamplingParams  # noqa: E402
from swarm_node.swarm.transport import BlobFetch, OwnedValue, Transport, check_blob, check_owned_value  # noqa: E402



class LightPeer(Transport):
    """One DHT peer on a shared event loop: `Transport` over an in-process hivemind `DHTNode`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, node: Any, subkey: bytes, swarm_id: str) -> None:
        self._loop, self._node, self._subkey, self.swarm_id = loop, node, subkey, swarm_id
        self.traffic: dict[str, int] = {"bytes_out": 0, "bytes_in": 0, "store_failures": 0, "get_timeouts": 0}

    @classmethod
    def start(cls, loop: asyncio.AbstractEventLoop, swarm_id: str, initial_peers: list[str], host: str,
              window_s: float, staleness: int, key_path: Path) -> LightPeer:
        """A peer whose libp2p identity is the RSA key at `key_path` (created once), as a node's is:
        the owner of its signed subkeys is then its peer id."""
        from hivemind.dht.node import DHTNode
        from hivemind.dht.validation import CompositeValidator

        from swarm_node.swarm.identity import load_or_create_key
        from swarm_node.swarm.index import owned_key_schedule
        from swarm_node.swarm.validators import (CachedRSASignatureValidator, OwnedRecordValidator,
                                                 ScheduledKeySchemaValidator, SwarmRecordValidator)

        schedule = owned_key_schedule(swarm_id, window_s, staleness)
        identity = load_or_create_key(key_path)
        signer = CachedRSASignatureValidator(identity.private_key)
        validator = CompositeValidator([signer, SwarmRecordValidator(swarm_id), ScheduledKeySchemaValidator(schedule),
                                        OwnedRecordValidator(swarm_id, schedule)])
        create = DHTNode.create(initial_peers=initial_peers, record_validator=validator, host_maddrs=[f"/ip4/{host}/tcp/0"],
                                num_replicas=5, cache_locally=False, cache_on_store=False, cache_nearest=0,
                                wait_timeout=3.0, bootstrap_timeout=30.0, identity_path=str(identity.path))
        node = asyncio.run_coroutine_threadsafe(create, loop).result(90.0)
        return cls(loop, node, signer.local_public_key, swarm_id)

    def _run(self, coro: Any, timeout: float) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout + 2.0)
        except TimeoutError:
            fut.cancel()
            return None

    @property
    def peer_id(self) -> str:
        return self._node.peer_id.to_base58()

    @property
    def public_key(self) -> bytes:
        return self._subkey

    def dht_time(self) -> float:
        from hivemind.utils.timed_storage import get_dht_time

        return get_dht_time()

    def _store(self, keys_: list[str], values: list[bytes], subkeys: list[bytes | None], expiration: float,
               timeout: float) -> dict[Any, bool]:
        async def store() -> dict[Any, bool]:
            try:
                return await asyncio.wait_for(self._node.store_many(keys_, values, expiration, subkeys=subkeys), timeout)
            except asyncio.TimeoutError:
                return {}
        result = self._run(store(), timeout) or {}
        ok = {k: bool(result.get((k, sk) if sk is not None else k)) for k, sk in zip(keys_, subkeys)}
        self.traffic["store_failures"] += sum(not v for v in ok.values())
        self.traffic["bytes_out"] += sum(len(v) for v in values)
        return ok

    def store_owned(self, key: str, value: bytes, expiration_time: float, timeout: float = 10.0) -> bool:
        check_owned_value(value, expiration_time, self.dht_time())
        return self._store([key], [value], [self._subkey], expiration_time, timeout)[key]

    def put_blob(self, data: bytes, expiration_time: float, timeout: float = 10.0) -> str:
        return self.put_blobs([data], expiration_time, timeout)[0]

    def put_blobs_and_owned(self, blobs: Any, key: str, value: bytes, expiration_time: float,
                            timeout: float = 10.0) -> bool:
        from swarm_node.swarm.transport import blob_digest

        digests = [blob_digest(b) for b in blobs]
        ks = [keys.chunk_key(self.swarm_id, d) for d in digests] + [key]
        ok = self._store(ks, [*blobs, value], [None] * len(blobs) + [self._subkey], expiration_time, timeout)
        return ok[key]

    def _get(self, keys_: list[str], latest: bool, timeout: float) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            futures = await self._node.get_many(keys_, sufficient_expiration_time=float("inf") if latest else None,
                                                return_futures=True)
            done, pending = await asyncio.wait(list(futures.values()), timeout=timeout)
            for f in pending:
                f.cancel()
            return {k: f.result() for k, f in futures.items() if f in done and not f.cancelled()
                    and f.exception() is None}
        found = self._run(read(), timeout) if keys_ else {}
        if found is None:
            found = {}
        self.traffic["get_timeouts"] += len(set(keys_) - set(found))
        return found

    def get_all_many(self, keys_: Any, timeout: float) -> dict[str, dict[str, OwnedValue]]:
        from swarm_node.swarm.validators import owned_values

        wanted = list(dict.fromkeys(keys_))
        found, now = self._get(wanted, True, timeout), self.dht_time()
        out = {k: owned_values(found.get(k), now) for k in wanted}
        self.traffic["bytes_in"] += sum(len(v.value) for d in out.values() for v in d.values())
        return out

    def get_blobs(self, digests: Any, timeout: float) -> BlobFetch:
        out = BlobFetch()
        by_key = {keys.chunk_key(self.swarm_id, d): d for d in dict.fromkeys(digests)}
        found = self._get(list(by_key), False, timeout)
        for key, d in by_key.items():
            item = found.get(key)
            data = item.value if item is not None else None
            reason = "missing" if data is None else check_blob(d, data)
            if reason is None:
                out.found[d] = data
                self.traffic["bytes_in"] += len(data)
            else:
                out.failed[d] = reason
        return out

    def shutdown(self) -> None:
        self._run(self._node.shutdown(), 10.0)


def group_for(peer: str, spec: dict[str, Any], pset: dict[str, Any], index: int, created_at: float,
              version: int, rng: random.Random) -> RolloutGroup:
    """G completions `\\boxed{N}` of problem `index`, about half right (mixed rewards)."""
    question_sha, answer = pset["problems"][index]
    completions = []
    for _ in range(spec["group_size"]):
        right = rng.random() < 0.5
        try:
            shown = answer if right else str(int(answer) + rng.choice([-2, -1, 1, 2, 10]))
        except ValueError:
            shown = answer if right else "0"
        text = f"\\boxed{{{shown}}}"
        data = text.encode()
        ids = np.array([spec["char_ids"][c] for c in text] + [spec["eos_id"]], dtype=np.uint32)
        logprobs = np.array([-rng.expovariate(2.0) for _ in ids], dtype=np.float32)
        completions.append(Completion(token_ids=ids, logprobs=logprobs, finish_reason="stop",
                                      claimed_reward=float(right), text=text,
                                      piece_bytes=np.array([1] * len(data) + [0], dtype=np.uint16)))
    return RolloutGroup(
        swarm_id=spec["swarm_id"], sender=peer, model_id="soak/light-peer", model_revision="0",
        tokenizer_fingerprint=spec["fingerprint"], policy_version=version, created_at=created_at,
        prompt=PromptRef(prompt_set_id=pset["id"], index=index, sha256=question_sha),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=spec["max_new_tokens"]),
        completions=tuple(completions))


def step_slot(last: tuple[int, int], now: float, window_seconds: float) -> tuple[int, int]:
    """(window, slot) of a step starting at DHT time `now`, after a last step at `last`: the
    window of `now` itself, and the next slot of it when the last step was in the same window."""
    window = keys.window_of(now, window_seconds)
    return window, (last[1] + 1 if last[0] == window else 0)


class LightSwarm:
    """`count` light peers sharing one event loop thread; `tick` runs one step of each."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from swarm_node.swarm.exchange import RolloutExchange
        from protocol import keys
        from swarm_node.swarm.storage import CappedStorage
        from swarm_node.swarm.validators import key_id

        self.spec = spec
        status_ids = [key_id(k) for k in keys.status_keys(spec["swarm_id"])]
        CappedStorage.install(*spec["storage_caps"], incumbent_keys=status_ids)  # as a node's DHT process does
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="light-peers", daemon=True)
        self.thread.start()
        self.peers: list[LightPeer] = []
        Path(spec["key_dir"]).mkdir(parents=True, exist_ok=True)
        for i in range(spec["count"]):
            self.peers.append(LightPeer.start(self.loop, spec["swarm_id"], spec["initial_peers"], spec["host"],
                                              spec["window_seconds"], spec["staleness"],
                                              Path(spec["key_dir"]) / f"peer-{i}.key"))
        self.exchanges = [RolloutExchange(p, spec["swarm_id"], vocab_size=spec["vocab_size"],
                                          max_new_tokens=spec["max_new_tokens"], window_seconds=spec["window_seconds"],
                                          record_ttl_s=spec["record_ttl_s"], tokenizer_fingerprint=spec["fingerprint"],
                                          cross_tokenizer=True)
                          for p in self.peers]
        self.rng = random.Random(spec["seed"])
        self.versions = [0] * len(self.peers)
        self.slots = [(-1, -1)] * len(self.peers)  # (window, slot) of each peer's last step
        self.log = open(Path(spec["out"]), "a", buffering=1)  # noqa: SIM115  (closed in close())

    def prompt_set(self) -> dict[str, Any]:
        return json.loads(Path(self.spec["prompt_file"]).read_text())

    def tick(self) -> None:
        """One step of every light peer, in turn. Each takes its own start time, as a node's step
        does: its groups' `created_at` and the window they are listed and bound in come from it (the
        peers of a process step one after another, so the later ones may be in the next window),
        and its k-th step in a window answers that window's slot k."""
        spec, pset = self.spec, self.prompt_set()
        n = len(pset["problems"])
        for i, (peer, ex) in enumerate(zip(self.peers, self.exchanges)):
            now = peer.dht_time()
            window, slot = self.slots[i] = step_slot(self.slots[i], now, spec["window_seconds"])
            before = dict(peer.traffic)
            indices = window_prompts(peer.peer_id, window, slot, spec["prompts_per_step"], n, salt=spec["swarm_id"])
            groups = [group_for(peer.peer_id, spec, pset, j, now, self.versions[i], self.rng) for j in indices]
            ex.publish_groups(groups, window)
            got, drops = ex.fetch_groups(window, spec["staleness"], spec["max_groups"], spec["max_per_peer"],
                                         spec["fetch_timeout"], self.rng)
            self.versions[i] += 1
            ex.publish_status(NodeStatus(peer_id=peer.peer_id, role="trainer", model_id="soak/light-peer",
                                         step=self.versions[i], timestamp=peer.dht_time(),
                                         metrics={"groups_gathered": float(len(got))},
                                         tokenizer_fingerprint=spec["fingerprint"]))
            self.log.write(json.dumps({
                "time": time.time(), "peer": peer.peer_id, "window": window, "published": len(groups),
                "gathered": len(got), "drops": dict(drops), "prompt_set": pset["id"],
                "taken": [[g.sender, g.created_at] for g in got],
                "bytes_out": peer.traffic["bytes_out"] - before["bytes_out"],
                "bytes_in": peer.traffic["bytes_in"] - before["bytes_in"],
                "store_failures": peer.traffic["store_failures"] - before["store_failures"],
                "get_timeouts": peer.traffic["get_timeouts"] - before["get_timeouts"],
            }) + "\n")

    def close(self) -> None:
        for p in self.peers:
            p.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)
        self.log.close()


def main(spec_path: str) -> int:
    from swarm_node.util.lifecycle import daemons_die_with_this_process

    spec = json.loads(Path(spec_path).read_text())
    daemons_die_with_this_process()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    swarm = LightSwarm(spec)
    print(f"light peers up: {len(swarm.peers)} (torch imported: {'torch' in sys.modules}) pid {os.getpid()}",
          flush=True)
    try:
        last = -1
        while not stop.is_set() and time.time() < spec["stop_at"]:
            window = keys.window_of(swarm.peers[0].dht_time(), spec["window_seconds"])
            if window != last:  # one step of every peer per window
                swarm.tick()
                last = window
            stop.wait(1.0)
    finally:
        swarm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
