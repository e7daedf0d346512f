"""The peer ledger inside the node loop (real tiny models, real trainer, in-memory swarm): what it
attributes to each sender matches the step metrics, and a restarted node keeps it and its trust."""

from __future__ import annotations

import json

import pytest

from swarm_node.peers.ledger import FILE_NAME
from swarm_node.swarm.memory import MemorySwarm
from tests.unit.test_node_loop import make_node


def _rows(node):
    return {r["peer_id"]: r for r in node.parts.ledger.rows()}


def test_ledger_attributes_the_steps_numbers_to_the_sender(tmp_path):
    swarm = MemorySwarm()
    a, b = make_node(tmp_path, swarm, "A"), make_node(tmp_path, swarm, "B", model="tiny-random:96x1:a")
    steps = []
    for _ in range(2):
        a.run_step()
        steps.append(b.run_step())
    row = _rows(b)["A"]
    total = lambda key: sum(m.get(key, 0.0) for m in steps)  # noqa: E731
    assert row["taken"] == total("peer_groups") >= 1
    assert row["samples"] == total("peer_samples") == 4 * row["taken"]
    assert row["gradient"] == total("peer_samples_gradient")
    assert row["filtered"] == total("filtered")  # the filter's scope is peers' samples
    assert row["offered"] == row["taken"] + row["dropped"]
    # Every peer sample was scored: its KL and weight are the ones the step's metrics summarise.
    assert row["kl"]["count"] == row["samples"] and row["is_weight"]["count"] == row["samples"]
    kl = sum(m["kl_peer_mean"] * m["peer_samples"] for m in steps) / total("peer_samples")
    assert row["kl"]["mean"] == pytest.approx(kl, rel=1e-6, abs=1e-9)
    assert row["reputation"]["good"] > 0 and row["reputation"]["faults"] == 0
    assert a.parts.ledger is not None and "B" in a.parts.ledger


@pytest.mark.parametrize("cross_tokenizer", ["true", "false"])
def test_drops_are_attributed_to_the_sender(tmp_path, cross_tokenizer):
    """Groups without text (on) or any group (off) of another tokenizer: dropped, the sender's
    tokenizer named (the exchange drops them when off, peer_rollouts.py when on)."""
    swarm = MemorySwarm()
    other = make_node(tmp_path, swarm, "B", model="tiny-random:64x1:b",  # another tokenizer
                      extra=['swarm.send_text="never"'])
    a = make_node(tmp_path, swarm, "A", extra=[f"swarm.cross_tokenizer={cross_tokenizer}"])
    other.run_step()
    m = a.run_step()
    row = _rows(a)["B"]
    assert row["taken"] == 0 and row["samples"] == 0 and row["crosstok"] == 0
    assert row["dropped_by_reason"] == {"tokenizer_mismatch": m["dropped_tokenizer_mismatch"]}
    assert row["tokenizer"] == other.parts.policy.fingerprint and row["tokenizer_same"] is False


def test_restart_mid_run_keeps_counts_and_reputation(tmp_path):
    swarm = MemorySwarm()
    a, b = make_node(tmp_path, swarm, "A"), make_node(tmp_path, swarm, "B", model="tiny-random:96x1:a")
    a.run_step()
    b.run_step()  # checkpoint.every_steps=1: the ledger is written with the checkpoint
    before = _rows(b)["A"]
    trust = b.parts.exchange.admission.reputation.good["A"]
    assert before["taken"] >= 1 and trust > 0
    saved = json.loads((tmp_path / "B" / FILE_NAME).read_text())
    assert [p["peer_id"] for p in saved["peers"]] == ["A"]

    restarted = make_node(tmp_path, swarm, "B", model="tiny-random:96x1:a")
    assert restarted.step == 1
    admission = restarted.parts.exchange.admission
    assert admission.reputation is restarted.parts.ledger.reputation
    assert admission.reputation.good["A"] == pytest.approx(trust)
    assert _rows(restarted)["A"] == before
    a.run_step()
    restarted.run_step()
    after = _rows(restarted)["A"]
    assert after["taken"] > before["taken"] and after["samples"] > before["samples"]
    assert after["first_seen"] == before["first_seen"]


def test_a_damaged_ledger_never_stops_the_node(tmp_path, caplog):
    swarm = MemorySwarm()
    (tmp_path / "B").mkdir()
    (tmp_path / "B" / FILE_NAME).write_text('{"format": 1, "peers": [')  # a torn write
    a = make_node(tmp_path, swarm, "A")
    b = make_node(tmp_path, swarm, "B", model="tiny-random:96x1:a")
    assert len(b.parts.ledger) == 0
    assert any(p.name.startswith(FILE_NAME + ".damaged-") for p in (tmp_path / "B").iterdir())
    assert any("peer ledger" in r.getMessage() and "empty ledger" in r.getMessage() for r in caplog.records)
    a.run_step()
    m = b.run_step()
    assert m["step"] == 1 and _rows(b)["A"]["taken"] == m["peer_groups"]
    assert json.loads((tmp_path / "B" / FILE_NAME).read_text())["format"] == 1


def test_isolated_node_keeps_no_ledger(tmp_path):
    node = make_node(tmp_path, None, "solo")
    node.run(max_steps=1)
    assert node.parts.ledger is None and not (tmp_path / "solo" / FILE_NAME).exists()


def test_a_node_exports_its_ledger_to_prometheus(tmp_path):
    from prometheus_client import generate_latest

    from swarm_node.observe.prometheus import PrometheusExporter

    swarm = MemorySwarm()
    a = make_node(tmp_path, swarm, "A")
    b = make_node(tmp_path, swarm, "B", model="tiny-random:96x1:a",
                  extra=['metrics.prometheus_addr="127.0.0.1:0"', "metrics.prometheus_top_peers=1"])
    try:
        a.run_step()
        b.run_step()
        exporter = next(s.__self__ for s in b.parts.sinks if isinstance(getattr(s, "__self__", None), PrometheusExporter))
        text = generate_latest(exporter.registry).decode()
        taken = _rows(b)["A"]["samples"]
        assert taken > 0 and f'swarm_node_ledger_samples{{peer="A"}} {float(taken)}' in text
    finally:
        for hook in reversed(b.parts.close_hooks):
            hook()


def test_trainer_attributes_each_measurement_to_its_sample(tmp_path):
    """Winners (reward 1, on-policy logprobs) and losers (reward 0, logprobs 3 nats lower per token)
    of two mixed groups: the per-sample flags and weights must land on the right sender, although
    the trainer scores losers (no gradient) in another pass and order than winners."""
    import dataclasses

    from swarm_node.config import ObjectiveConfig, TrainConfig
    from swarm_node.policy.trainer import Trainer
    from tests.unit.test_policy_trainer import make_policy, make_samples

    policy = make_policy(tmp_path)
    samples = make_samples(policy, [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0]], peer=True)
    samples = [dataclasses.replace(s, source="winner") if s.reward == 1.0 else
               dataclasses.replace(s, source="loser", generator_logprobs=s.generator_logprobs - 3.0)
               for s in samples]
    samples += make_samples(policy, [[1.0, 0.0]], seed=1)  # own samples: not in the peer stats
    trainer = Trainer(policy, TrainConfig(learning_rate=1e-5, micro_batch_size=3),
                      ObjectiveConfig(variant="f-tis", kl_threshold=1e6), temperature=1.0)
    metrics = trainer.step(samples)
    stats = trainer.peer_sample_stats
    assert [s.peer for s in stats] == [s.source for s in samples if s.is_peer]
    assert [s.reward for s in stats] == [s.reward for s in samples if s.is_peer]
    winners = [s for s in stats if s.peer == "winner"]
    losers = [s for s in stats if s.peer == "loser"]
    assert len(winners) == len(losers) == 4
    assert all(s.gradient and not s.filtered and abs(s.is_weight - 1.0) < 1e-3 and s.kl < 1e-3 for s in winners)
    assert all(s.filtered and not s.gradient and s.is_weight > 15.0 and s.kl > 1.0 for s in losers)
    assert sum(s.gradient for s in stats) == metrics["peer_samples_gradient"]
