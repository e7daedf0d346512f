"""report: plots are real PNGs and the summary's numbers equal hand-computed ones."""

from __future__ import annotations

import json
import struct

import pytest

from swarm_node import metric_names as m
from swarm_node.observe.report import console_lines, find_metrics_files, read_summary, summarize, write_report

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
               m.IS_WEIGHT_MEAN: 1.0, m.IS_WEIGHT_MAX: 1.5 + s, m.MIXED_GROUPS: 0.5, m.PEER_SAMPLES_GRADIENT: p // 2}
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
    (run / "node-0" / "evals.jsonl").write_text('{"step": 0, "accuracy": 0.25, "n": 64}\n'
                                                '{"step": 8, "accuracy": 0.5, "n": 64}\n')
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
    # node-0: held-out 0.25 -> 0.5 (evals.jsonl: 16/64 -> 32/64, Wilson intervals; rows without per-problem
    # outcomes: Newcombe's interval of the difference, above 0); 8 rewards, quarters of 2: (0, .1) -> 0.05 and
    # (.6, .7) -> 0.65; last 3 accuracies (.5, .5, .6) -> 0.533; own 8*32 = 256; peer used
    # 0+4+8*6 = 52, with gradient half of each: 26; drops at steps 3 and 6.
    assert rows["node-0"] == ["8", "0.250 [0.160, 0.368]", "0.500 [0.381, 0.619]",
                              "improved (+0.250, 95% interval [+0.082, +0.399])", "0.050", "0.650", "0.500",
                              "0.533", "256", "52", "26", "", "0.250", "bad_tokenizer: 2, stale: 4"]
    # node-1: the torn last line is ignored; no evaluation; quarters of 1: 0.2 and 0.6.
    assert rows["node-1"] == ["4", "", "", "", "0.200", "0.600", "0.500", "0.500", "128", "8", "4", "", "0.250", "none"]
    assert "held-out (64) before [95%] | after [95%] | held-out change" in summary.read_text()
    assert _png_size(run_dir / "report" / "heldout.png")[2] > 5000
    saved = {r["name"]: r for r in json.loads((run_dir / "report" / "summary.json").read_text())}
    assert saved["node-0"]["heldout_before"] == 0.25 and saved["node-0"]["heldout_after"] == 0.5
    assert saved["node-0"]["heldout_change"]["verdict"] == "improved" and saved["node-0"]["heldout_after_step"] == 8
    assert saved["node-0"]["heldout_before_interval"] == pytest.approx([0.160, 0.368], abs=1e-3)
    assert saved["node-1"]["heldout_before"] is None and saved["node-1"]["reward_last_quarter"] == 0.6
    lines = console_lines(read_summary(run_dir / "report"))
    assert lines[0].startswith("node-0: held-out 0.250 [0.160, 0.368] -> 0.500 [0.381, 0.619] at step 8: improved "
                               "(+0.250, 95% interval [+0.082, +0.399]); reward first quarter 0.050 -> last quarter 0.650")
    assert lines[1].startswith("node-1: held-out not evaluated")


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
    from swarm_node.util.errors import InputError

    with pytest.raises(InputError, match="no metrics.jsonl under"):
        write_report(tmp_path)
