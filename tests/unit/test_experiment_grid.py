"""The experiment harness end to end on tiny models: a 2-arm x 2-seed grid runs with the production
node code, an interrupted grid resumes without redoing finished runs, lockstep is deterministic for
a seed, the swarm-mode config round-trips, and peer_lag delays what peers see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from swarm_node.util.atomic import file_lock
from swarm_node.experiment.grid import prepare_models, run_grid
from swarm_node.experiment.lockstep import Delivery, LaggedTransport, RoundClock
from swarm_node.experiment.spec import ExperimentSpec
from swarm_node.experiment.configs import node_config
from swarm_node.experiment.swarm_mode import local_file
from swarm_node.util.machine import fingerprint
from swarm_node.swarm.memory import MemorySwarm

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

SPEC = """
[experiment]
name = "tiny"
seeds = [0, 1]
steps = 2
cache_dir = "{cache}"
[eval]
every = 2
problems = 4
batch_size = 4
max_new_tokens = 12
[defaults]
generation = {{ group_size = 4, max_new_tokens = 12 }}
train = {{ prompts_per_step = 2, micro_batch_size = 4, learning_rate = 0.01 }}
task = {{ name = "arithmetic", levels = [1], size = 50, format_reward = 0.5, system_prompt = "Answer in \\\\boxed{{}}." }}
[[nodes]]
name = "a"  # a few supervised steps: it writes \\boxed{{}} sometimes, so rewards differ within groups
warmup = {{ base = "tiny-random:32x1", steps = 60, batch_size = 8, learning_rate = 0.01 }}
[[nodes]]
name = "b"
model = "tiny-random:32x1:a:1"
[[arms]]
name = "isolated"
variant = "isolated"
[[arms]]
name = "f-tis"
variant = "f-tis"
"""

def _volatile(key: str) -> bool:
    """Wall-clock measurements: the only values two runs of one seed may differ in (`bytes_sent`
    and `bytes_received` count status records too, which carry the step's timings, so their size
    varies; a node reads them for its tokenizer census, `swarm.send_text = auto`; `given_age_s`: the age
    of the node's last read of its receipts)."""
    return key in ("time", "bytes_sent", "bytes_received", "given_age_s") or key.endswith("_seconds") or key.endswith("_per_s")


def _stable(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not _volatile(k)} for r in rows]


@pytest.fixture()
def spec(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(SPEC.format(cache=tmp_path / "cache"))
    return ExperimentSpec.load(path)


def test_grid_runs_resumes_and_is_deterministic(spec, tmp_path):
    out = tmp_path / "out"
    logs: list[str] = []
    run_grid(spec, out, log=logs.append, stop_after=3)  # an interruption after three runs
    done = sorted(p.parent.relative_to(out / "runs").as_posix() for p in out.glob("runs/*/*/*/done.json"))
    assert done == ["all/f-tis/seed0", "all/isolated/seed0", "all/isolated/seed1"]
    first = {d: (out / "runs" / d / "done.json").stat().st_mtime_ns for d in done}
    partial = out / "runs/all/f-tis/seed1"
    partial.mkdir(parents=True)
    (partial / "evals.jsonl").write_text("torn")  # a run killed half-way: started over

    logs.clear()
    table = run_grid(spec, out, log=logs.append)
    assert sum("done already, skipped" in m for m in logs) == 3
    assert {d: (out / "runs" / d / "done.json").stat().st_mtime_ns for d in done} == first
    assert (partial / "done.json").exists()
    assert json.loads((partial / "done.json").read_text())["machine"] == fingerprint()  # the summary lists it

    # The summary: every arm x node, two seeds, and a real plot.
    assert set(table) == {"all|isolated|a", "all|isolated|b", "all|f-tis|a", "all|f-tis|b"}
    assert all(row["seeds"] == [0, 1] for row in table.values())
    assert (out / "plots/all.png").read_bytes()[:8] == PNG_MAGIC
    md = (out / "summary.md").read_text()
    assert "| f-tis | a |" in md and "| isolated | b |" in md
    evals = _stable(out / "runs/all/f-tis/seed0/evals.jsonl")
    assert [(r["node"], r["step"]) for r in evals] == [("a", 0), ("b", 0), ("a", 2), ("b", 2)]
    assert all(r["n"] == 4 for r in evals)
    # The production node ran: its metrics log has every step, and the swarm arm saw peer samples.
    swarm_log = _stable(out / "runs/all/f-tis/seed0/b/metrics.jsonl")
    assert [r["step"] for r in swarm_log] == [1.0, 2.0]
    assert sum(r["peer_samples"] for r in swarm_log) > 0
    iso_log = _stable(out / "runs/all/isolated/seed0/b/metrics.jsonl")
    assert sum(r["peer_samples"] for r in iso_log) == 0

    # Determinism: the same run again gives the same metrics and evaluations.
    run = out / "runs/all/f-tis/seed0"
    before = (_stable(run / "a/metrics.jsonl"), _stable(run / "b/metrics.jsonl"), evals)
    (run / "done.json").unlink()
    run_grid(spec, out, log=logs.append)
    after = (_stable(run / "a/metrics.jsonl"), _stable(run / "b/metrics.jsonl"), _stable(run / "evals.jsonl"))
    assert after == before
    assert any(r["active_tokens"] > 0 and r["grad_norm"] > 0 for r in before[0])  # the compared runs trained


@pytest.mark.parametrize(("every", "mid_grid"), [(0.0, True), (1e9, False)])
def test_summary_is_rewritten_mid_grid_at_most_every_summary_every_seconds(spec, tmp_path, every, mid_grid):
    out = tmp_path / "out"
    seen: list[bool] = []

    def log(msg: str) -> None:
        if msg.endswith("(lockstep)"):  # a run starts: is there a summary of the runs before it?
            seen.append((out / "summary.md").exists())

    run_grid(spec, out, log=log, arms=["isolated"], summary_every=every)
    assert seen == [False, mid_grid]
    assert "| isolated | a |" in (out / "summary.md").read_text()  # always written at the end


def test_a_run_another_process_holds_is_passed_over_and_made_later(spec, tmp_path):
    out = tmp_path / "out"
    (out / "runs/all/isolated").mkdir(parents=True)
    logs: list[str] = []
    with file_lock(out / "runs/all/isolated/seed0.lock") as held:  # "another process" is running seed 0
        assert held
        run_grid(spec, out, log=logs.append, arms=["isolated"])
    assert "[1/2] all/isolated/seed0: running in another process, skipped" in logs
    assert not (out / "runs/all/isolated/seed0/done.json").exists()
    assert (out / "runs/all/isolated/seed1/done.json").exists()
    logs.clear()
    run_grid(spec, out, log=logs.append, arms=["isolated"])  # the holder died: the run is made now
    assert (out / "runs/all/isolated/seed0/done.json").exists()
    assert "[2/2] all/isolated/seed1: done already, skipped" in logs
    assert not list(out.glob("runs/*/*/*.lock"))  # a finished run's claim file is removed


def test_a_warm_model_another_process_trains_is_waited_for_after_the_others(spec, tmp_path):
    warm_dir = tmp_path / "cache/warm"
    warm_dir.mkdir(parents=True)
    name = spec.node("a").warmup_for(spec, 0).cache_name()
    assert name != spec.node("a").warmup_for(spec, 1).cache_name()  # one warm model per seed here
    logs: list[str] = []
    lock = file_lock(warm_dir / f"{name}.lock")
    assert lock.__enter__()  # "another process" trains seed 0's warm model; it stops 2 s later
    timer = threading.Timer(2.0, lambda: lock.__exit__(None, None, None))
    timer.start()
    try:
        models = prepare_models(spec, logs.append, {"a"})
    finally:
        timer.join()
    order = [m for m in logs if m.startswith("node a")]
    assert order[0] == "node a seed 0: warm model being trained by another process; later"
    assert order[1].startswith("node a seed 1: warm model warm-")  # trained meanwhile
    assert order[2].startswith(f"node a seed 0: warm model {name}")
    assert models[("a", 0)] == str(warm_dir / name) and (warm_dir / name).is_dir()


def test_two_workers_share_one_grid_each_run_made_once(spec, tmp_path):
    """`swarm-node experiment --workers 2`: two child processes on one directory, no filters: every
    run and each warm model are made once (without the claims, each process would make every run, or
    remove the other's unfinished run and fail), and the parent writes the whole grid's summary."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "swarm_node", "experiment", str(tmp_path / "exp.toml"), "--out", str(out),
           "--workers", "2", "--allocator", "system"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"2 workers on {out}, OMP_NUM_THREADS=1 each, allocator of the system"
    logs = {k: [ln.removeprefix(f"[worker {k}] ") for ln in lines if ln.startswith(f"[worker {k}] ")] for k in (1, 2)}
    made = {k: [ln.split()[1] for ln in log if " finished in " in ln and ln.startswith("[")] for k, log in logs.items()}
    runs = ["all/f-tis/seed0", "all/f-tis/seed1", "all/isolated/seed0", "all/isolated/seed1"]
    assert sorted(made[1] + made[2]) == runs  # each run once, by one of the two
    assert made[1] and made[2]  # both worked
    assert sorted(p.parent.relative_to(out / "runs").as_posix() for p in out.glob("runs/*/*/*/done.json")) == runs
    for seed in (0, 1):  # each seed's warm model trained once, by one process
        name = spec.node("a").warmup_for(spec, seed).cache_name()
        assert sum(ln.count(f"warm-up {name} step 60/60") for ln in lines) == 1, proc.stdout
    parent = [ln for ln in lines if not ln.startswith("[worker ")]
    assert sum("done already, skipped" in ln for ln in parent) == 4  # the parent made none, then summed up
    assert parent[-1].startswith("experiment finished in ")
    assert "| f-tis | a |" in (out / "summary.md").read_text()
    # The workers' stderr is a pipe: no `\r` progress bars (transformers' weight loading) among the relayed lines.
    assert "\r" not in proc.stdout + proc.stderr and "Loading weights" not in proc.stdout + proc.stderr


def test_peer_lag_holds_writes_back(tmp_path):
    clock = RoundClock(30.0)
    swarm = MemorySwarm(clock=clock)
    delivery = Delivery(swarm, lag=2)
    a = LaggedTransport(swarm, "a", delivery, clock)
    b = LaggedTransport(swarm, "b", delivery, clock)
    a.store_owned("k", b"v0", clock() + 1000)
    digest = a.put_blob(b"blob", clock() + 1000)
    assert b.get_all("k", 1.0) == {} and b.get_blob(digest, 1.0) is None
    clock.round = 1
    delivery.release(1)
    assert b.get_all("k", 1.0) == {}
    clock.round = 2
    delivery.release(2)
    assert b.get_all("k", 1.0)["a"].value == b"v0" and b.get_blob(digest, 1.0) == b"blob"


def test_swarm_mode_file_reproduces_each_node_config(spec, tmp_path):
    import tomllib

    from swarm_node.ops import local

    configs = [(n.name, node_config(spec, n, spec.arms[1], 3, i, tmp_path / n.name, n.model or "tiny-random:32x1"))
               for i, n in enumerate(spec.nodes)]
    path = tmp_path / "local.toml"
    path.write_text(local_file(configs, every=2, steps=2))
    assert tomllib.loads(path.read_text())["nodes"] == 2
    shared, per_node = local.plan_nodes(2, path)
    for i, (name, cfg) in enumerate(configs):
        got = local.node_config(shared, per_node[i], i, tmp_path / "run", 2, [], [])
        assert per_node[i]["name"] == name
        assert got.model == cfg.model and got.objective == cfg.objective and got.train == cfg.train
        assert got.task == cfg.task and got.generation == cfg.generation
        assert got.checkpoint.every_steps == 2


def test_unknown_arm_is_named(spec, tmp_path):
    with pytest.raises(ValueError, match=r"unknown arms \['vis'\]; the file has \['isolated', 'f-tis'\]"):
        run_grid(spec, tmp_path / "out", arms=["vis"])


@pytest.mark.slow  # real `swarm-node local` processes over the hivemind DHT, ~1 min
def test_swarm_mode_runs_an_arm_as_real_processes(spec, tmp_path):
    """The confirmation path: one chosen arm as real node processes, evaluated from their checkpoints."""
    spec.experiment.seeds = [0]
    spec.experiment.steps = spec.eval.every = 4
    out = tmp_path / "out"
    table = run_grid(spec, out, mode="swarm", arms=["f-tis"])
    assert set(table) == {"all|f-tis|a", "all|f-tis|b"}  # only the chosen arm ran
    assert not (out / "runs/all/isolated").exists()
    run = out / "runs/all/f-tis/seed0"
    assert json.loads((run / "done.json").read_text())["mode"] == "swarm"
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert [(r["node"], r["step"]) for r in evals] == [("a", 0), ("a", 4), ("b", 0), ("b", 4)]
    assert all(r["n"] == 4 and 0.0 <= r["accuracy"] <= 1.0 for r in evals)
    for node in ("a", "b"):  # each process trained every step and logged it where the summary reads it
        steps = [json.loads(line)["step"] for line in (run / node / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1.0, 2.0, 3.0, 4.0]
    assert "| f-tis | a |" in (out / "summary.md").read_text()


def test_arm_peer_lag_delivers_groups_older_than_the_record_ttl(spec, tmp_path):
    """An arm's own peer_lag: peers' groups arrive `lag` steps late and are still taken, even when the lag
    outlasts the file's record TTL (node_config raises the TTL and the staleness bound to admit them)."""
    from swarm_node.experiment.spec import ArmSpec

    spec.experiment.seeds = [0]
    spec.experiment.steps = spec.eval.every = 4
    spec.defaults.setdefault("swarm", {})["record_ttl_s"] = 40.0  # 30-s windows: a record lives ~1 step
    spec.arms.append(ArmSpec(name="f-tis-lag2", correction="tis", filter="on", peer_lag=2))
    assert spec.peer_lag(spec.arms[-1]) == 2 and spec.peer_lag(spec.arms[1]) == 0
    out = tmp_path / "out"
    run_grid(spec, out, arms=["f-tis-lag2"])
    for node in ("a", "b"):
        log = _stable(out / f"runs/all/f-tis-lag2/seed0/{node}/metrics.jsonl")
        taken = [r.get("peer_groups", 0.0) for r in log]
        assert taken[:2] == [0.0, 0.0] and sum(taken[2:]) > 0, (node, taken)  # none before step 3, then some
    assert "| f-tis-lag2 | 2 | a |" in (out / "summary.md").read_text()  # the weights table names the lag
