"""State a node leaves behind is never lost or counted twice: a damaged newest checkpoint falls back
to the newest intact one, metrics rows of steps that are run again are superseded, and `eval
--checkpoint` evaluates the model the checkpoint records. Through the real command, in process."""

from __future__ import annotations

import json
import logging
from pathlib import Path


from tests.cli_run import _restore_signals, run  # noqa: F401 (an autouse fixture)
from swarm_node.observe.metrics import read_metrics_jsonl, supersede_after
from swarm_node.util.jsonl import latest_run

TINY = ["-s", "generation.group_size=2", "-s", "generation.max_new_tokens=4", "-s", "train.prompts_per_step=1",
        "-s", "checkpoint.every_steps=2", "-s", "checkpoint.keep=3"]


def steps(path: Path) -> list[int]:
    return [int(r["step"]) for r in read_metrics_jsonl(path)]


def test_latest_run_keeps_the_last_run_of_each_step():
    rows = [{"step": s, "run": 1} for s in (1, 2, 3, 4)] + [{"step": s, "run": 2} for s in (3, 4, 5)]
    kept = latest_run(rows)
    assert [(r["step"], r["run"]) for r in kept] == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]
    # resumed from step 2 and stopped at 3: the old 4 is gone too
    rows = [{"step": s, "run": 1} for s in (1, 2, 3, 4)] + [{"step": 3, "run": 2}]
    assert [(r["step"], r["run"]) for r in latest_run(rows)] == [(1, 1), (2, 1), (3, 2)]


def test_supersede_after_moves_later_rows_and_loses_none(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s * 10}) + "\n" for s in (1, 2, 3, 4)) + '{"step": 5, "x"')
    assert supersede_after(path, 2) == 2
    assert steps(path) == [1, 2]
    assert steps(tmp_path / "metrics.superseded.jsonl") == [3, 4]
    assert supersede_after(path, 2) == 0  # idempotent


def test_damaged_newest_checkpoint_falls_back_and_rows_are_superseded(capsys, tmp_path, caplog):
    node = tmp_path / "n"
    base = ["train", "-s", "model.name=tiny-random:64x1:a", "-s", f"model.cache_dir={json.dumps(str(tmp_path / 'c'))}",
            *TINY, "--node-dir", str(node)]
    code, _, _ = run(capsys, *base, "--steps", "4")
    assert code == 0 and steps(node / "metrics.jsonl") == [1, 2, 3, 4]
    newest = node / "checkpoints" / "step-00000004"
    (newest / "weights.safetensors").write_bytes(b"torn")
    with caplog.at_level(logging.WARNING):
        code, _, err = run(capsys, *base, "--steps", "5")
    assert code == 0, err
    assert any("skipping damaged checkpoint" in r.getMessage() and "step-00000004" in r.getMessage()
               for r in caplog.records)
    # resumed at 2: steps 3 and 4 ran again; the first run's rows of them moved aside, none lost
    assert steps(node / "metrics.jsonl") == [1, 2, 3, 4, 5]
    assert steps(node / "metrics.superseded.jsonl") == [3, 4]
    code, out, _ = run(capsys, "report", str(node))
    assert code == 0
    summary = (node / "report" / "summary.md").read_text()
    assert "| n | 5 |" in summary  # 5 steps, last step 5: none counted twice
    saved = json.loads((node / "report" / "summary.json").read_text())
    assert (saved[0]["steps"], saved[0]["last_step"]) == (5, 5)


def test_every_checkpoint_damaged_is_a_one_line_runtime_error(capsys, tmp_path):
    node = tmp_path / "n"
    base = ["train", "-s", "model.name=tiny-random:64x1:a", "-s", f"model.cache_dir={json.dumps(str(tmp_path / 'c'))}",
            *TINY, "--node-dir", str(node)]
    assert run(capsys, *base, "--steps", "2")[0] == 0
    (node / "checkpoints" / "step-00000002" / "trainer.pt").write_bytes(b"torn")
    code, _, err = run(capsys, *base, "--steps", "4")
    assert code == 1 and err[-1].startswith("swarm-node: error: every checkpoint in")
    assert "step-00000002 (trainer.pt" in err[-1]
    assert steps(node / "metrics.jsonl") == [1, 2]  # nothing written by the failed start
    assert (node / "checkpoints" / "step-00000002").is_dir()  # nor removed


def test_eval_checkpoint_loads_the_model_it_records(capsys, tmp_path):
    node = tmp_path / "n"
    cache = ["-s", f"model.cache_dir={json.dumps(str(tmp_path / 'c'))}"]
    code, _, _ = run(capsys, "train", "-s", "model.name=tiny-random:64x1:b", *cache, *TINY, "--node-dir", str(node),
                     "--steps", "2")
    assert code == 0
    ckpt = node / "checkpoints" / "step-00000002"
    # the config names model a (another vocabulary): a's module could not take b's weights
    code, out, err = run(capsys, "eval", "--checkpoint", str(ckpt), "-s", "model.name=tiny-random:64x1:a", *cache,
                         "--limit", "2", "--max-new-tokens", "4", "--json")
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["n"] == 2 and 0.0 <= result["lo"] <= result["accuracy"] <= result["hi"] <= 1.0  # 95% Wilson
    (ckpt / "weights.safetensors").write_bytes(b"torn")
    code, _, err = run(capsys, "eval", "--checkpoint", str(ckpt), *cache, "--limit", "2")
    assert code == 2 and str(ckpt) in err[-1] and "cannot be loaded" in err[-1]
