"""report: plots are real PNGs and the summary's numbers equal hand-computed ones."""

from __future__ import annotations

import json
import struct

import pytest

from swarm_node import metrics as m
from swarm_node.report import find_metrics_files, summarize, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_node(path, records, torn_tail=False):
    path.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in records)
    if torn_tail:
        text += '{"step": 99, "reward_me'
    (path / "metrics.jsonl").write_text(text)


def _records(rewards, acc, peer_used, drops_every=None):
    out = []
    for s, (r, a, p) in enumerate(zip(rewards, acc, peer_used, strict=True), start=1):
        rec = {m.STEP: s, m.REWARD_MEAN: r, m.ACCURACY: a, m.OWN_SAMPLES: 32, m.PEER_SAMPLES_USED: p,
               m.FILTERED_FRACTION: 0.25, m.KL_MEAN: 1.0 / s, m.KL_P90: 2.0 / s,
               m.IS_WEIGHT_MEAN: 1.0, m.IS_WEIGHT_MAX: 1.5 + s}
        if drops_every and s % drops_every == 0:
            rec["dropped_stale"] = 2
            rec["dropped_bad_tokenizer"] = 1
        out.append(rec)
    return out


@pytest.fixture()
def run_dir(tmp_path):
    run = tmp_path / "run1"
    a = _records([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], [0.0, 0.1, 0.1, 0.2, 0.4, 0.5, 0.5, 0.6],
                 [0, 4, 8, 8, 8, 8, 8, 8], drops_every=3)
    b = _records([0.2, 0.2, 0.4, 0.6], [0.1, 0.3, 0.5, 0.7], [2, 2, 2, 2])
    b[-1][m.EVAL_ACCURACY] = 0.42
    _write_node(run / "node-0", a)
    _write_node(run / "node-1", b, torn_tail=True)
    return run


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    width, height = struct.unpack(">II", data[16:24])
    return width, height, len(data)


def test_report_writes_plots_and_hand_checked_table(run_dir):
    summary = write_report(run_dir, window=3)
    assert summary == run_dir / "report" / "summary.md"
    for stem in ("reward", "accuracy", "filtered_fraction", "kl", "importance_weights"):
        w, h, n = _png_size(run_dir / "report" / f"{stem}.png")
        assert (w, h) == (700, 400) and n > 5000, stem
        assert f"![{stem}]({stem}.png)" in summary.read_text()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in summary.read_text().splitlines() if line.startswith("| node-")}
    # node-0: first 3 rewards (0, .1, .2) -> 0.1; last 3 (.5, .6, .7) -> 0.6; last 3 accuracies
    # (.5, .5, .6) -> 0.533; peer used 0+4+8*6 = 52; own 8*32 = 256; drops at steps 3 and 6.
    assert rows["node-0"] == ["8", "8", "0.100", "0.600", "0.533", "", "256", "52", "0.250",
                              "bad_tokenizer: 2, stale: 4"]
    # node-1: the torn last line is ignored; rewards (.2,.2,.4) -> .267 and (.2,.4,.6) -> .4.
    assert rows["node-1"] == ["4", "4", "0.267", "0.400", "0.500", "0.420", "128", "8", "0.250", "none"]


def test_summarize_window_and_missing_values():
    recs = [{m.STEP: 1}, {m.STEP: 2, m.REWARD_MEAN: 1.0}, {m.STEP: 3, m.REWARD_MEAN: float("nan")}]
    s = summarize("n", recs, window=5)
    assert (s.steps, s.last_step, s.reward_first, s.reward_last) == (3, 3, 1.0, 1.0)
    assert s.accuracy_last is None and s.eval_accuracy is None and s.drops == {}


def test_single_node_dir_and_missing_metric_plot(tmp_path):
    node = tmp_path / "solo"
    _write_node(node, [{m.STEP: s, m.REWARD_MEAN: s / 10} for s in range(1, 4)])
    assert list(find_metrics_files(node)) == ["solo"]
    text = write_report(node).read_text()
    assert (node / "report" / "reward.png").exists()
    assert not (node / "report" / "kl.png").exists()
    assert "No data for: accuracy, filtered_fraction, kl, importance_weights." in text


def test_empty_run_dir_raises(tmp_path):
    from swarm_node.errors import InputError

    with pytest.raises(InputError, match="no metrics.jsonl under"):
        write_report(tmp_path)
