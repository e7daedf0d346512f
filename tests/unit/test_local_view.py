"""`swarm-node local`'s output: the live table fits 80 columns without cutting values, and the plain
line per step (stdout not a terminal) carries the same numbers."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from swarm_node.observe.local_view import LiveView, short_model, status_table, step_line

ROW = {"step": 12, "reward_mean": 0.4567, "accuracy": 0.25, "own_samples": 12, "peer_samples": 4,
       "peer_samples_used": 3, "filtered_nonpositive_advantage": 5, "filtered_kl": 1, "dropped_stale": 2,
       "dropped_malformed": 1, "total_dropped_stale": 5, "tokens_per_s": 1234.5, "step_seconds": 61.2}


class FakeProc:
    def __init__(self, rc):
        self.rc = rc

    def poll(self):
        return self.rc


@dataclass
class Node:
    name: str
    node_dir: Path
    proc: FakeProc
    model: str
    lora: bool


def nodes(tmp_path: Path) -> list[Node]:
    out = []
    for i, (name, model, lora, rc) in enumerate([("node-with-a-long-name", "HuggingFaceTB/SmolLM2-135M-Instruct", True, None),
                                                  ("full", "Qwen/Qwen2.5-Coder-1.5B-Instruct", False, 143)]):
        d = tmp_path / f"n{i}"
        d.mkdir()
        (d / "metrics.jsonl").write_text(json.dumps(ROW) + "\n" + '{"step": 13, "rew')  # a torn last line
        out.append(Node(name, d, FakeProc(rc), model, lora))
    return out


def test_table_fits_80_columns_without_ellipses(tmp_path):
    console = Console(width=80, record=True, force_terminal=True, file=io.StringIO())
    console.print(status_table(nodes(tmp_path), 100000))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    assert "…" not in text
    assert " 12 " in text and "0.46" in text and "    5 " in text and "1234" in text and "exit 143" in text
    assert "SmolLM2-135~+L" in text and "Qwen2.5-Coder~" in text  # 14 characters each


def test_short_model_names():
    assert short_model("org/Model", False) == "Model"
    assert short_model("tiny-random:64x1:a", True) == "tiny-random~+L"
    assert len(short_model("a/" + "x" * 40, False)) == 14


def test_plain_lines_when_not_a_terminal(tmp_path, capsys):
    console = Console(file=io.StringIO(), force_terminal=False)
    view = LiveView(console, 100000)
    procs = nodes(tmp_path)
    view.update(procs)
    view.update(procs)  # nothing new: nothing printed twice
    view.close(procs)
    out = capsys.readouterr().out.splitlines()
    assert console.file.getvalue().startswith("2 nodes, 100000 steps each")
    assert out[0] == step_line("node-with-a-long-name", ROW, 100000)
    assert out[0].startswith("node-with-a-long-name step 12/100000 reward 0.457 acc 0.250 own 12 peer 4 used 3 "
                             "filtered 5/1 dropped 3 tok/s 1234")
    assert sum(" step 12/" in ln for ln in out) == 2 and "full exit 143" in out
    assert "\r" not in "".join(out) and "\x1b" not in "".join(out)
