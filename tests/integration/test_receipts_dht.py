"""Receipts over a real DHT (hivemind processes on loopback, tiny models): three nodes train on each
other's groups; each node's `swarm-node status --given` view (the receipts in the other nodes'
signed status records) matches exactly what those nodes' ledgers count of its groups; a status
record written into another node's owned subkey (receipts forged in its name) is refused by the
DHT and counted, and a record naming another peer than its signer is refused too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from protocol import codec, keys
from protocol.messages import NodeStatus, Receipt
from swarm_node.node.assemble import build_parts, start_transport
from swarm_node.config import NodeConfig
from swarm_node.node.loop import Node
from tests.fakes import hash_reward

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
SWARM = "itest-receipts"
COUNTS = ("taken", "samples", "gradient", "filtered", "filtered_advantage", "filtered_kl")


def node_config(tmp: Path, name: str, model: str, bootstrap: list[str]) -> NodeConfig:
    return NodeConfig.load(None, [
        f'node_dir="{tmp / name}"', f'model.name="{model}"', f'model.cache_dir="{tmp / "cache"}"',
        'model.device="cpu"', "generation.group_size=4", "generation.max_new_tokens=12",
        "train.prompts_per_step=2", "train.learning_rate=1e-2", "train.total_steps=100",
        f'swarm.swarm_id="{SWARM}"', 'swarm.host_maddrs=["/ip4/127.0.0.1/tcp/0"]',
        f"swarm.initial_peers={json.dumps(bootstrap)}", "swarm.max_peer_fraction=0.75",
        "swarm.max_peer_groups_per_step=6", "swarm.max_groups_per_peer=4", "swarm.fetch_timeout_s=5.0",
        "checkpoint.every_steps=50", "task.levels=[1]", "task.size=50", "metrics.status_every_steps=1",
        "metrics.status_min_interval_s=0"])


def status_given(bootstrap: str, target: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "swarm_node", "status", "--given", target, "--initial-peer",
                          bootstrap, "--swarm-id", SWARM, "--json", "--timeout", "15"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout[-1000:] + res.stderr[-2000:]
    return json.loads(res.stdout)


def refused(transports) -> int:
    return sum(t.dht_refusals().get("bad_signature", 0) for t in transports)


def test_status_given_matches_the_receivers_ledgers_and_forged_receipts_are_refused(tmp_path):
    from hivemind.dht.crypto import RSASignatureValidator

    boot_cfg = node_config(tmp_path, "bootstrap", "tiny-random:64x1:a", [])
    bootstrap = start_transport(boot_cfg.swarm, tmp_path / "bootstrap")
    maddrs = [str(a) for a in bootstrap.visible_maddrs]
    nodes: list[Node] = []
    mallory = None
    try:
        for name, model in (("a", "tiny-random:64x1:a"), ("b", "tiny-random:128x2:a"), ("c", "tiny-random:64x1:a")):
            cfg = node_config(tmp_path, name, model, maddrs)
            transport = start_transport(cfg.swarm, cfg.node_dir)
            parts, start = build_parts(cfg, transport=transport)
            parts.close_hooks.append(transport.shutdown)
            parts.reward_fn = hash_reward
            nodes.append(Node(parts, start_step=start))
        for _ in range(3):
            for node in nodes:
                node.run_step()  # publishes its status record, receipts included, at the end of the step
        for node in nodes:
            node.save_ledger()

        ids = {n.parts.peer_id: n for n in nodes}
        for node in nodes:
            view = status_given(maddrs[0], str(node.cfg.node_dir))
            assert view["peer_id"] == node.parts.peer_id and view["statement"]
            got = {r["receiver"]: r for r in view["receivers"]}
            expected = {}
            for receiver, other in ids.items():
                row = next((r for r in other.parts.ledger.rows() if r["peer_id"] == node.parts.peer_id), None)
                if receiver != node.parts.peer_id and row is not None:
                    expected[receiver] = row
            assert set(got) == set(expected), (node.parts.peer_id, got.keys(), expected.keys())
            assert any(r["taken"] > 0 for r in expected.values())  # its groups were trained on
            for receiver, row in expected.items():  # exact counts, the same span: since each ledger began
                assert {k: got[receiver][k] for k in COUNTS} == {k: row[k] for k in COUNTS}, receiver
                assert got[receiver]["dropped_by_reason"] == row["dropped_by_reason"], receiver
                assert got[receiver]["span_s"] > 0
            totals = view["totals"]
            assert totals["taken"] == sum(r["taken"] for r in expected.values())
            assert totals["gradient"] == sum(r["gradient"] for r in expected.values())
            assert totals["takers"] == sum(1 for r in expected.values() if r["taken"] > 0)
        assert sum(r["gradient"] for n in nodes for r in n.parts.ledger.rows()) > 0  # receipts of real gradient

        # Mallory (a DHT peer of the swarm) forges receipts: node a "took 999 groups" of Mallory's.
        victim = nodes[0]
        mallory = start_transport(node_config(tmp_path, "mallory", "tiny-random:64x1:a", maddrs).swarm,
                                  tmp_path / "mallory")
        forged = NodeStatus(peer_id=victim.parts.peer_id, role="trainer", model_id="m", step=999,
                            timestamp=mallory.dht_time(), receipts_span_s=60.0,
                            receipts=(Receipt(sender=mallory.peer_id, taken=999, samples=3996, gradient=3996,
                                              filtered=0, filtered_advantage=0, filtered_kl=0),))
        transports = [bootstrap, mallory, *(n.parts.exchange.transport for n in nodes)]
        before = refused(transports)
        victim_subkey = RSASignatureValidator(victim.parts.exchange.transport.identity.private_key).local_public_key
        victim_key = keys.status_key(SWARM, keys.status_shard(victim.parts.peer_id))
        stored = mallory._dht.store(victim_key, codec.encode(forged), mallory.dht_time() + 120, subkey=victim_subkey)
        assert stored is False  # no replica keeps a record its owner did not sign
        assert refused(transports) > before  # ... and each refusal is counted (bad_signature)
        # Under its own subkey, a record naming another peer is refused as well.
        own = RSASignatureValidator(mallory.identity.private_key).local_public_key
        assert mallory._dht.store(victim_key, codec.encode(forged), mallory.dht_time() + 120, subkey=own) is False
        view = status_given(maddrs[0], mallory.peer_id)
        assert view["receivers"] == [] and view["totals"]["taken"] == 0  # no forged receipt reached a reader
        records = {s.peer_id: s for s in victim.parts.exchange.read_statuses(timeout=10)}
        assert records[victim.parts.peer_id].step == victim.step  # the victim's own record is intact
    finally:
        for node in nodes:
            node._shutdown()
        if mallory is not None:
            mallory.shutdown()
        bootstrap.shutdown()
