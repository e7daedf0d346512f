"""The soak's bytes prediction per node (benchmarks/soak/report.py): the scale model at a node's own step rate."""

from __future__ import annotations

import pytest

from benchmarks.soak.report import node_prediction, scale_prediction


@pytest.fixture(scope="module")
def predicted() -> dict:
    return scale_prediction(peers=24, active=6, steps_per_window=3.0, tokens=8)


def test_the_split_of_a_round_adds_up_to_the_whole(predicted: dict) -> None:
    parts = (predicted["client_bytes_per_node_round"] + predicted["served_bytes_per_node_round"]
             + predicted["status_bytes_per_node_round"])
    assert parts == pytest.approx(predicted["bytes_per_node_round"], abs=3)
    assert min(predicted["client_bytes_per_node_round"], predicted["served_bytes_per_node_round"],
               predicted["status_bytes_per_node_round"]) > 0


def test_a_node_at_the_median_rate_gets_the_models_round(predicted: dict) -> None:
    rpw = predicted["rounds_per_window"]
    assert node_prediction(predicted, float(rpw)) == pytest.approx(predicted["bytes_per_node_round"], abs=3)
    assert node_prediction(predicted, None) == predicted["bytes_per_node_round"]


def test_a_slow_node_carries_the_per_time_traffic_of_every_window_its_step_spans(predicted: dict) -> None:
    """A node stepping once in six windows: its per-step client traffic once, the replica and status
    traffic of six windows (3 rounds each at the median rate) on that one step."""
    per_time = predicted["served_bytes_per_node_round"] + predicted["status_bytes_per_node_round"]
    slow = node_prediction(predicted, 1 / 6)
    assert slow == pytest.approx(predicted["client_bytes_per_node_round"] + per_time * 3 * 6, abs=3)
    assert slow > 5 * predicted["bytes_per_node_round"]
    assert node_prediction(predicted, 6.0) < predicted["bytes_per_node_round"]  # a fast node: less per step


def _receipt_run(tmp_path, receipt_taken: int, reads: list[tuple[float, int]], final: int) -> dict:
    """Receiver R (started at t=0) took groups of sender S; its ledger was read at `reads` (time,
    count) and holds `final` at the end; S's `status --given` shows R's receipt over the last 600 s
    of t=1000 (the ring rolled over: the span starts at t=400)."""
    import json

    from benchmarks.soak.ledgers import given_agreement

    ids = {"QmR": "R", "QmS": "S"}
    (tmp_path / "R").mkdir()
    (tmp_path / "R" / "peer_ledger.json").write_text(json.dumps({"peers": [{"peer_id": "QmS", "taken": final}]}))
    given = {"node": "S", "given": {"receivers": [{"receiver": "QmR", "timestamp": 1000.0, "span_s": 600.0,
                                                   "taken": receipt_taken}]}}
    (tmp_path / "given.jsonl").write_text(json.dumps(given) + "\n")
    events = [{"kind": "start", "node": "R", "time": 0.0}, {"kind": "start", "node": "S", "time": 0.0}]
    ledgers = [{"node": "R", "time": t, "taken": {"QmS": n}} for t, n in reads]
    return given_agreement(tmp_path, ids, events, ledgers)


def test_a_receipt_is_compared_exactly_when_the_reads_around_its_span_start_agree(tmp_path) -> None:
    reads = [(390.0, 2), (405.0, 2), (900.0, 5)]
    assert _receipt_run(tmp_path, 3, reads, final=5)["agree"] == 1
    (tmp_path / "b").mkdir()
    wrong = _receipt_run(tmp_path / "b", 4, reads, final=5)
    assert wrong["agree"] == 0 and wrong["mismatches"][0]["ledger_taken_in_span"] == 3


def test_a_take_between_two_reads_bounds_the_span_and_outside_the_bounds_is_a_mismatch(tmp_path) -> None:
    """The receiver's file is first written at t=454 (after its first step), one take before it:
    its count at t=400 is 0 or 1, so a receipt of 0 or 1 agrees and 2 does not."""
    reads = [(454.0, 1), (470.0, 1)]
    for taken, agrees in ((0, True), (1, True), (2, False)):
        d = tmp_path / str(taken)
        d.mkdir()
        r = _receipt_run(d, taken, reads, final=1)
        assert (r["agree"] == 1) is agrees, r
        assert r["within_sampling"] == int(agrees)
