"""Metrics: canonical names, the JSONL log (torn tails) and the Prometheus endpoint over HTTP."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest

from swarm_node import metric_names as m
from swarm_node.observe.metrics import JsonlMetricsWriter, read_metrics_jsonl
from swarm_node.observe import prometheus


def test_every_canonical_name_is_documented():
    names = [v for k, v in vars(m).items() if k.isupper() and isinstance(v, str) and k not in ("DROPPED_PREFIX", "TOTAL_DROPPED_PREFIX", "FILTERED_PREFIX", "GIVEN_DROPPED_PREFIX")]
    assert set(names) == set(m.METRICS)
    assert all(m.METRICS[n].strip() for n in names)
    for name in ("kl_p99", "bytes_per_token", "peer_samples_used", "ess", "eval_accuracy"):
        assert name in m.METRICS


def test_a_step_takes_each_name_from_one_writer():
    assert m.merge({m.LOSS: 1}, {m.STEP: 2.0}, {}) == {m.LOSS: 1.0, m.STEP: 2.0}
    with pytest.raises(ValueError, match="'reward_mean' is written by two writers"):
        m.merge({m.REWARD_MEAN: 0.5, m.LOSS: 1.0}, {m.REWARD_MEAN: 0.25})


def test_jsonl_round_trip_and_reopen(tmp_path):
    path = tmp_path / "node" / "metrics.jsonl"
    with JsonlMetricsWriter(path) as w:
        w.write({m.STEP: 1, m.REWARD_MEAN: 0.25, m.KL_MAX: float("nan")})
        w.write({m.STEP: 2, m.REWARD_MEAN: 0.5})
    with JsonlMetricsWriter(path) as w:  # appends, never truncates complete records
        w.write({m.STEP: 3, m.REWARD_MEAN: 0.75})
    recs = read_metrics_jsonl(path)
    assert [r[m.STEP] for r in recs] == [1, 2, 3]
    assert [r[m.REWARD_MEAN] for r in recs] == [0.25, 0.5, 0.75]
    assert math.isnan(recs[0][m.KL_MAX])


def test_reader_tolerates_truncated_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "lo')
    recs = read_metrics_jsonl(path)
    assert recs == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}]


def test_reader_keeps_complete_last_record_without_newline(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}')
    assert [r["step"] for r in read_metrics_jsonl(path)] == [1, 2]


def test_reader_rejects_corruption_in_the_middle(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match=":2: corrupt"):
        read_metrics_jsonl(path)


def test_writer_cuts_a_torn_tail_before_appending(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "rew')
    with JsonlMetricsWriter(path) as w:
        w.write({"step": 3})
    assert path.read_text() == '{"step": 1}\n{"step": 3}\n'
    assert [r["step"] for r in read_metrics_jsonl(path)] == [1, 3]


def test_writer_rejects_non_numbers(tmp_path):
    with JsonlMetricsWriter(tmp_path / "x.jsonl") as w, pytest.raises(TypeError, match="loss"):
        w.write({"loss": "high"})


def test_dropped_and_filtered_helpers():
    assert m.dropped_name("stale") == "dropped_stale"
    with pytest.raises(ValueError):
        m.dropped_name("bad reason!")
    assert m.dropped_counts({"dropped_stale": 2, "dropped_bad_tokenizer": 1.0, "loss": 3}) == {
        "stale": 2.0, "bad_tokenizer": 1.0}
    fr = m.filtered_fractions({m.OWN_SAMPLES: 24, m.PEER_SAMPLES: 8, m.FILTERED_KL: 4,
                               m.FILTERED_NONPOSITIVE_ADVANTAGE: 16})
    assert fr == {"nonpositive_advantage": 0.5, "kl": 0.125}
    assert m.filtered_fractions({m.FILTERED_KL: 3}) == {}


def _scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values, body


def test_prometheus_serves_documented_names_with_values():
    step_metrics = {name: float(i) + 0.5 for i, name in enumerate(m.METRICS)}
    with prometheus.PrometheusExporter("127.0.0.1:0") as exp:
        exp.update({**step_metrics, "dropped_stale": 2, "dropped_bad_version": 1})
        exp.update({m.STEP: 7, "dropped_stale": 3, "total_dropped_stale": 5})
        values, body = _scrape(exp.port)
        port = exp.port
    for name, v in step_metrics.items():
        if name != m.STEP:
            assert values[f"swarm_node_{name}"] == v, name
        assert f"# HELP swarm_node_{name} {m.METRICS[name]}" in body
    assert values["swarm_node_step"] == 7.0
    assert values['swarm_node_dropped_total{reason="stale"}'] == 5.0
    assert values['swarm_node_dropped_total{reason="bad_version"}'] == 1.0
    assert "swarm_node_total_dropped_stale" not in values  # the counter is the running total
    with pytest.raises(OSError):  # stopped: nothing listens any more
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_prometheus_unset_metrics_are_absent_and_bad_input_raises():
    with prometheus.PrometheusExporter("127.0.0.1:0") as exp:
        exp.update({m.REWARD_MEAN: 0.5, "custom_thing": 2.0})
        values, _ = _scrape(exp.port)
        assert values["swarm_node_reward_mean"] == 0.5
        assert values["swarm_node_custom_thing"] == 2.0
        assert "swarm_node_kl_mean" not in values
        with pytest.raises(ValueError):
            exp.update({"dropped_stale": -1})
        with pytest.raises(ValueError):
            exp.update({"bad-name": 1.0})


def test_prometheus_addr_parsing():
    assert prometheus.parse_addr("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert prometheus.parse_addr("[::1]:9400") == ("::1", 9400)
    for bad in ("9400", "host:", "host:99999"):
        with pytest.raises(ValueError):
            prometheus.parse_addr(bad)


def test_jsonl_records_are_one_object_per_line(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonlMetricsWriter(path) as w:
        for s in range(5):
            w.write({m.STEP: s, m.LOSS: s / 10})
    lines = path.read_text().splitlines()
    assert [json.loads(x)[m.STEP] for x in lines] == list(range(5))
