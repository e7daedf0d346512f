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
