"""The node's status records: published at most every `metrics.status_min_interval_s` seconds (a
store answers with every record the key holds, so a record at every step of a fast node was most of
its bytes), retried after a failed store, and the held-back last step published at shutdown."""

from __future__ import annotations

from types import SimpleNamespace

from swarm_node.config import NodeConfig
from swarm_node.node.assemble import StatusSink


class Exchange:
    def __init__(self) -> None:
        self.published: list = []
        self.ok = True

    def publish_status(self, status) -> bool:
        if self.ok:
            self.published.append(status)
        return self.ok


class Ledger:
    def receipts(self, max_senders: int):
        return 0.0, ()


def sink(interval: float, every: int = 1):
    cfg = NodeConfig.load(None, [f"metrics.status_min_interval_s={interval}", f"metrics.status_every_steps={every}"])
    now = [1000.0]
    transport = SimpleNamespace(peer_id="QmMe", dht_time=lambda: now[0], visible_maddrs=[])
    policy = SimpleNamespace(model_id="tiny", fingerprint="f" * 64)
    ex = Exchange()
    return StatusSink(ex, transport, cfg, policy, Ledger(), clock=lambda: now[0]), ex, now


def test_one_record_per_interval_and_the_last_step_at_shutdown():
    s, ex, now = sink(30.0)
    for step in range(1, 61):  # a step a second for a minute
        s({"step": step, "loss": 0.5})
        now[0] += 1.0
    assert [st.step for st in ex.published] == [1, 31]
    s.flush()  # shutting down: the held-back newest step goes out
    assert [st.step for st in ex.published] == [1, 31, 60]
    s.flush()
    assert len(ex.published) == 3  # nothing held back: nothing more


def test_a_failed_store_is_tried_again_at_the_next_step():
    s, ex, now = sink(30.0)
    ex.ok = False
    s({"step": 1})
    now[0] += 1.0
    ex.ok = True
    s({"step": 2})
    assert [st.step for st in ex.published] == [2]


def test_interval_zero_publishes_every_step_and_every_steps_still_holds():
    s, ex, now = sink(0.0)
    for step in range(1, 5):
        s({"step": step})
    assert [st.step for st in ex.published] == [1, 2, 3, 4]
    s, ex, now = sink(0.0, every=2)
    for step in range(1, 5):
        s({"step": step})
    assert [st.step for st in ex.published] == [2, 4]
