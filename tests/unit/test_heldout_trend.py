"""The node's held-out trend while it runs: eval.every_steps (config and schedule), the evaluations
in the step metrics and the status record, and where they are shown (`status`, `status --heldout`,
the dashboard's history and sources, Prometheus)."""

from __future__ import annotations

import io
import json
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from swarm_node import metric_names as m
from swarm_node.config import EVAL_EVERY_STEPS, EVAL_PROBLEMS, NodeConfig
from swarm_node.evaluation.heldout import due, eval_metrics, latest_metrics, read_evals
from swarm_node.evaluation.stats import IMPROVED, NO_CHANGE, PAIRED


def test_schedule_every_n_steps_and_after_the_last():
    assert [s for s in range(11) if due(s, 3, 10)] == [3, 6, 9, 10]
    assert [s for s in range(11) if due(s, 0, 10)] == [10]  # 0: only after the last (and before the first)
    assert [s for s in range(7) if due(s, 2, None)] == [2, 4, 6]  # lockstep: no known end
    assert not due(0, 1, 0)  # step 0 is the run's own "before" evaluation, never a periodic one


def test_every_steps_config():
    assert NodeConfig().eval.problems == EVAL_PROBLEMS and NodeConfig().eval.period == EVAL_EVERY_STEPS
    cfg = NodeConfig.load(None, ["eval.every_steps=5"])
    assert (cfg.eval.problems, cfg.eval.period) == (64, 5)  # asking for a trend alone gives it 64 problems
    assert NodeConfig.load(None, ["eval.problems=8", "eval.every_steps=0"]).eval.period == 0
    again = NodeConfig.model_validate(json.loads(cfg.model_dump_json()))  # a dumped config reads back the same
    assert again.eval == cfg.eval
    from swarm_node.util.errors import describe

    with pytest.raises(ValueError) as e:
        NodeConfig.load(None, ["eval.every_steps=5", "eval.problems=0"])
    line = describe(e.value).line()
    assert "eval.every_steps=5 needs held-out problems but eval.problems=0" in line and "\n" not in line


def test_evaluation_is_on_by_default_where_the_node_has_a_held_out_set_and_it_pays():
    """Unset eval.problems: 64 on the embedded model's arithmetic, 0 for a tiny test model (an evaluation
    costs several of its steps and it answers nothing) and for tasks without a built-in held-out set;
    an explicit value always wins, and the resolved number is what a dump holds."""
    assert NodeConfig.load(None, []).eval.problems == EVAL_PROBLEMS
    assert NodeConfig.load(None, ['model.name="tiny-random:64x2"']).eval.problems == 0
    gsm = NodeConfig.load(None, ['task.name="gsm8k"', 'task.source="x.jsonl"'])
    assert gsm.eval.problems == 0
    assert NodeConfig.load(None, ["eval.problems=0"]).eval.problems == 0
    assert NodeConfig.load(None, ['model.name="tiny-random:64x2"', "eval.problems=8"]).eval.problems == 8
    assert json.loads(NodeConfig().model_dump_json())["eval"]["problems"] == EVAL_PROBLEMS


class RecordingEvaluator:
    """Stands for evaluation.heldout.HeldoutEvaluator: records the steps it is called at, returns a row."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def __call__(self, step: int) -> dict:
        self.steps.append(step)
        return {"step": step, "accuracy": (16 + step) / 64, "n": 64, "correct": 16 + step, "seconds": 1.5}


def _node(tmp_path: Path, name: str, extra: list[str], swarm=None):
    from tests.unit.test_node_loop import make_node

    return make_node(tmp_path, swarm, name, extra=["eval.max_new_tokens=4", *extra])


def test_node_evaluates_every_n_steps_and_carries_the_latest_in_its_metrics(tmp_path):
    node = _node(tmp_path, "periodic", ["eval.every_steps=2", "train.total_steps=5", "eval.problems=4"])
    fake = RecordingEvaluator()
    node.parts.evaluate = fake
    node.run()
    assert fake.steps == [0, 2, 4, 5]  # before, every 2 steps, after the last
    assert [int(h[m.EVAL_STEP]) for h in node.history] == [0, 2, 2, 4, 5]  # each step: the latest evaluation
    last = node.history[-1]
    assert last[m.EVAL_ACCURACY] == 21 / 64 and last[m.EVAL_N] == 64 and last[m.EVAL_SECONDS] == 1.5
    assert (last[m.EVAL_LO], last[m.EVAL_HI]) == pytest.approx((0.2257, 0.4500), abs=1e-4)  # Wilson of 21/64


def test_a_stopped_node_leaves_without_evaluating(tmp_path):
    node = _node(tmp_path, "stopped", ["eval.every_steps=1", "train.total_steps=5", "eval.problems=4"])
    fake = RecordingEvaluator()
    node.parts.evaluate = fake
    train = node.parts.trainer.step

    def train_and_stop(samples):  # a signal arrives while step 2 trains
        if node.step == 1:
            node.stop()
        return train(samples)

    node.parts.trainer.step = train_and_stop
    node.run()
    assert node.step == 2 and fake.steps == [0, 1]  # step 2 finishes, then the node leaves without evaluating


def test_real_evaluations_log_intervals_and_outcomes_and_reach_the_status_record(tmp_path):
    from swarm_node.swarm.memory import MemorySwarm

    swarm = MemorySwarm()
    node = _node(tmp_path, "A", ["eval.every_steps=2", "train.total_steps=4", "eval.problems=4"], swarm=swarm)
    node.run()
    rows = read_evals(tmp_path / "A")
    assert [r["step"] for r in rows] == [0, 2, 4]
    for r in rows:
        assert len(r["outcomes"]) == 4 and r["outcomes"].count("1") == r["correct"]
        assert 0.0 <= r["lo"] <= r["accuracy"] <= r["hi"] <= 1.0
    status = {s.peer_id: s for s in node.parts.exchange.read_statuses(timeout=1.0)}["A"]
    assert status.metrics[m.EVAL_STEP] == 4.0 and status.metrics[m.EVAL_ACCURACY] == rows[-1]["accuracy"]
    assert status.metrics[m.EVAL_LO] == pytest.approx(rows[-1]["lo"])
    # a node resuming there starts from its latest evaluation (shown before its next one)
    assert latest_metrics(tmp_path / "A", 4) == eval_metrics(rows[-1])
    assert latest_metrics(tmp_path / "A", 3) == eval_metrics(rows[1])


def _rows(tmp_path: Path) -> Path:
    before = "0" * 48 + "1" * 16
    rows = [{"step": 0, "accuracy": 0.25, "n": 64, "correct": 16, "seconds": 3.0, "heldout": "h", "outcomes": before},
            {"step": 10, "accuracy": 0.3125, "n": 64, "correct": 20, "seconds": 3.0, "heldout": "h",
             "outcomes": "1" * 4 + "0" * 44 + "1" * 16},
            {"step": 20, "accuracy": 0.5, "n": 64, "correct": 32, "seconds": 3.0, "heldout": "h",
             "outcomes": "1" * 16 + "0" * 32 + "1" * 16}]
    d = tmp_path / "node"
    d.mkdir()
    (d / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_status_heldout_shows_each_evaluation_with_interval_and_verdict(tmp_path, capsys):
    from swarm_node.observe.heldout_view import node_trend, run_heldout_status

    node_dir = _rows(tmp_path)
    points = node_trend(node_dir)
    assert [p["step"] for p in points] == [0, 10, 20] and points[0]["change"] is None
    assert (points[1]["change"]["verdict"], points[1]["change"]["gained"]) == (NO_CHANGE, 4)  # p = 0.125
    assert points[2]["change"]["verdict"] == IMPROVED and points[2]["change"]["test"] == PAIRED
    run_heldout_status(node_dir, as_json=False)
    out = capsys.readouterr().out
    assert "3 held-out evaluations" in out
    assert "0.250 [0.160, 0.368]" in out and "16/64" in out
    assert "no measurable change (+0.062, p=0.12)" in out and "improved (+0.250, p=3.1e-05)" in out  # 16 gained, 0 lost
    run_heldout_status(node_dir, as_json=True)
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(points))


def test_status_heldout_without_evaluations_is_one_line(tmp_path):
    from swarm_node.util.errors import InputError
    from swarm_node.observe.heldout_view import node_trend

    with pytest.raises(InputError, match="no held-out evaluation in .* yet"):
        node_trend(tmp_path)
    with pytest.raises(InputError, match="no node directory"):
        node_trend(tmp_path / "missing")


def test_swarm_status_table_shows_the_latest_heldout_with_its_interval():
    from protocol.messages import NodeStatus
    from swarm_node.observe.observer import render_table, status_rows

    row = {"step": 20, "accuracy": 0.5, "n": 64, "correct": 32, "seconds": 3.0}
    st = NodeStatus(peer_id="peerA", role="trainer", model_id="smollm2-135m", step=21, timestamp=100.0,
                    metrics={m.REWARD_MEAN: 0.4, **eval_metrics(row)})
    plain = NodeStatus(peer_id="peerB", role="trainer", model_id="smollm2-135m", step=3, timestamp=100.0,
                       metrics={m.REWARD_MEAN: 0.1})
    rows = {r["peer_id"]: r for r in status_rows([st, plain])}
    assert rows["peerA"]["heldout"] == pytest.approx({"accuracy": 0.5, "lo": 0.381, "hi": 0.619, "n": 64, "step": 20},
                                                      abs=1e-3)
    assert rows["peerB"]["heldout"] is None
    console = Console(file=io.StringIO(), width=200)
    console.print(render_table(list(rows.values()), now=110.0))
    text = console.file.getvalue()
    assert "held-out [95%]" in text and "0.50 [0.38,0.62] s20" in text


def test_dashboard_keeps_one_point_per_evaluation_and_reads_local_trends(tmp_path):
    from swarm_node.observe.dashboard import HeldoutSource, SwarmHistory
    from swarm_node.observe.dashboard.sources import Status

    history = SwarmHistory()
    for step, eval_step in ((1, 0), (2, 0), (3, 2), (4, 2), (5, 4)):
        row = {"step": eval_step, "accuracy": eval_step / 10, "n": 64, "correct": int(6.4 * eval_step)}
        history.ingest([Status("peerA", "m", step, float(step), {m.STEP: step, **eval_metrics(row)})], float(step))
    evals = history.series()["peerA"]["evals"]
    assert [e["step"] for e in evals] == [0, 2, 4] and len(history.series()["peerA"]["points"]) == 5
    assert all(e["lo"] <= e["accuracy"] <= e["hi"] for e in evals)
    nodes = HeldoutSource([_rows(tmp_path), tmp_path / "empty"]).read()
    assert [len(n["points"]) for n in nodes] == [3, 0]
    assert nodes[0]["error"] is None and "no held-out evaluation yet" in nodes[1]["error"]


def test_dashboard_serves_the_heldout_api(tmp_path):
    from swarm_node.observe.dashboard import DashboardServer, FakeStatusSource, HeldoutSource

    with DashboardServer(FakeStatusSource(), port=0, heldout_source=HeldoutSource([_rows(tmp_path)])) as dash:
        body = json.loads(urllib.request.urlopen(dash.url + "api/heldout", timeout=5).read())
    assert [p["step"] for p in body["nodes"][0]["points"]] == [0, 10, 20]


def test_prometheus_exports_the_latest_evaluation():
    from swarm_node.observe.prometheus import PrometheusExporter

    row = {"step": 20, "accuracy": 0.5, "n": 64, "correct": 32, "seconds": 3.0}
    with PrometheusExporter("127.0.0.1:0") as exp:
        exp.update({m.STEP: 21.0, **eval_metrics(row)})
        body = urllib.request.urlopen(f"http://127.0.0.1:{exp.port}/metrics", timeout=5).read().decode()
    values = dict(line.rsplit(" ", 1) for line in body.splitlines() if line.startswith("swarm_node_eval"))
    assert float(values["swarm_node_eval_accuracy"]) == 0.5 and float(values["swarm_node_eval_step"]) == 20.0
    assert float(values["swarm_node_eval_lo"]) == pytest.approx(0.3810, abs=1e-4)
    assert float(values["swarm_node_eval_n"]) == 64.0


def test_local_plain_lines_name_an_evaluation_in_the_step_it_followed():
    from swarm_node.observe.local_view import step_line

    row = {"step": 10, "accuracy": 0.5, "n": 64, "correct": 32, "seconds": 3.0}
    evaluated = {m.STEP: 10.0, m.REWARD_MEAN: 0.5, **eval_metrics(row)}
    assert step_line("full", evaluated, 20).endswith(" held-out 0.500 [0.381, 0.619]")
    later = {**evaluated, m.STEP: 11.0}  # the same evaluation carried into the next step: not repeated
    assert "held-out" not in step_line("full", later, 20)
