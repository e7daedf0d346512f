"""A node keeps the status records of the peers whose groups it took: when a read misses one (a
lost replica, a timeout, a flood that kept it out of the key), its receipts for this node stay in
the node's view until the record could have lapsed; a record of an identity the node never took a
group from is only what the read returns."""

from __future__ import annotations

from collections.abc import Sequence

from protocol import codec, keys
from protocol.messages import NodeStatus, Receipt
from swarm_node import metric_names as m
from swarm_node.peers.ledger import KEEP_STATUS_S, PeerLedger
from swarm_node.swarm.exchange import RolloutExchange
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.statuses import StatusKeeper

ME, WORKER, TALKER = "QmMe", "QmWorker", "QmTalker"


class LossyTransport(MemoryTransport):
    """A reader whose reads miss the records of the owners in `lost` (what a lost replica or a
    timed-out read does to it)."""

    lost: set[str] = set()

    def get_all_many(self, keys_: Sequence[str], timeout: float):
        return {k: {o: v for o, v in got.items() if o not in self.lost}
                for k, got in super().get_all_many(keys_, timeout).items()}


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _publish(swarm: MemorySwarm, peer: str, taken: int) -> None:
    writer = MemoryTransport(swarm, peer_id=peer)
    st = NodeStatus(peer_id=peer, role="trainer", model_id="m", step=1, timestamp=swarm.clock(),
                    receipts_span_s=60.0, receipts=(Receipt(sender=ME, taken=taken, samples=4 * taken, gradient=taken,
                                                            filtered=0, filtered_advantage=0, filtered_kl=0),))
    shard_key = keys.status_key("s", keys.status_shard(writer.peer_id))
    assert writer.store_owned(shard_key, codec.encode(st), swarm.clock() + 300)


def test_receipts_of_peers_this_node_took_from_survive_a_read_that_misses_them() -> None:
    clock = Clock(10_000.0)
    swarm = MemorySwarm(clock=clock)
    _publish(swarm, WORKER, taken=3)  # a peer whose groups this node took
    _publish(swarm, TALKER, taken=50)  # an identity that only wrote a record
    ledger = PeerLedger(None, own_peer=ME, clock=clock)
    ledger.record_group(WORKER, None)  # this node took one of WORKER's groups
    ledger.record_group(TALKER, "wrong_prompt")  # ... and none of TALKER's
    reader = LossyTransport(swarm, peer_id=ME)
    exchange = RolloutExchange(reader, "s", vocab_size=1, ledger=ledger)
    exchange.read_statuses(timeout=1.0)
    assert ledger.given_metrics()[m.GIVEN_RECEIVERS] == 2.0 and ledger.given_metrics()[m.GIVEN_GROUPS_TAKEN] == 53.0

    LossyTransport.lost = {WORKER, TALKER}  # the next reads miss both records
    try:
        clock.t += 600
        exchange.read_statuses(timeout=1.0)
        given = ledger.given_metrics()
        assert given[m.GIVEN_RECEIVERS] == 1.0 and given[m.GIVEN_GROUPS_TAKEN] == 3.0  # WORKER's, kept
        assert [r["peer_id"] for r in ledger.rows() if r["given"]] == [WORKER]
        clock.t += KEEP_STATUS_S  # past when WORKER's record could have lapsed
        exchange.read_statuses(timeout=1.0)
        assert ledger.given_metrics()[m.GIVEN_RECEIVERS] == 0.0
    finally:
        LossyTransport.lost = set()


def test_the_keeper_keeps_the_newest_record_and_only_while_it_lives() -> None:
    took = {WORKER}
    keeper = StatusKeeper(lambda: took, max_kept=1)

    def st(peer: str, t: float) -> NodeStatus:
        return NodeStatus(peer_id=peer, role="trainer", model_id="m", step=int(t), timestamp=t)

    assert [s.step for s in keeper.merge({WORKER: (st(WORKER, 5.0), 100.0), TALKER: (st(TALKER, 5.0), 100.0)}, 0.0)] == [5, 5]
    assert [s.peer_id for s in keeper.merge({}, 50.0)] == [WORKER] and keeper.kept_last == 1
    # an older record a stale replica answers with does not replace the newer kept one
    assert [s.step for s in keeper.merge({WORKER: (st(WORKER, 3.0), 100.0)}, 60.0)] == [5]
    took.clear()  # a peer this node forgot (its ledger's bound): its record is no longer kept
    assert keeper.merge({}, 60.0) == []
