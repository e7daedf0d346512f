"""GSM8K and MATH-500 loaders: gold extraction, local files, clear errors without `datasets`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm_node.config import TaskConfig
from swarm_node.tasks import load_prompt_set
from swarm_node.tasks.datasets import DatasetUnavailable, gsm8k_gold, load_gsm8k, load_math500

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
GSM8K_TRAIN = DATA / "gsm8k" / "train.jsonl"
MATH500 = DATA / "math500" / "test.jsonl"


def _need(path: Path) -> None:
    if not path.is_file():
        pytest.skip(f"shared data file missing: {path}")


def test_gsm8k_gold_is_number_after_hashes() -> None:
    assert gsm8k_gold("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72") == "72"
    assert gsm8k_gold("costs $1,200 in total\n#### 1,200") == "1200"
    assert gsm8k_gold("#### -3") == "-3"
    assert gsm8k_gold("first #### 5 then\n#### 6") == "6"
    with pytest.raises(ValueError, match="####"):
        gsm8k_gold("no final line 42")


def test_local_jsonl_rows_and_content_id(tmp_path: Path) -> None:
    f = tmp_path / "mini.jsonl"
    rows = [{"question": " Q one? ", "answer": "x\n#### 1,000"}, {"question": "Q two?", "answer": "#### 7"}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    s = load_gsm8k(str(f))
    assert [(p.index, p.question, p.answer) for p in s.problems] == [(0, "Q one?", "1000"), (1, "Q two?", "7")]
    assert s.answer_kind == "number" and s.id.startswith("gsm8k-")
    assert load_gsm8k(str(f)).id == s.id
    assert load_gsm8k(str(f), limit=1).id != s.id
    f.write_text(json.dumps(rows[0]) + "\n{broken\n")
    with pytest.raises(ValueError, match=":2:"):
        load_gsm8k(str(f))


def test_missing_local_file_and_hub_without_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DatasetUnavailable, match="does not exist"):
        load_gsm8k(str(tmp_path / "nope.jsonl"))
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DatasetUnavailable, match=r"shared/data/gsm8k/train.jsonl"):
        load_gsm8k("openai/gsm8k")
    with pytest.raises(DatasetUnavailable, match=r"shared/data/math500/test.jsonl"):
        load_math500("HuggingFaceH4/MATH-500")


def test_gsm8k_shared_train_file() -> None:
    _need(GSM8K_TRAIN)
    s = load_prompt_set(TaskConfig(name="gsm8k", source=str(GSM8K_TRAIN)))
    assert len(s) == 7473
    assert s.problems[0].answer == "72" and s.problems[0].question.startswith("Natalia sold clips")
    assert all(p.answer.lstrip("-").replace(".", "").isdigit() for p in s.problems)
    assert load_prompt_set(TaskConfig(name="gsm8k", source=str(GSM8K_TRAIN), limit=10)).problems == s.problems[:10]


def test_math500_shared_file() -> None:
    _need(MATH500)
    s = load_prompt_set(TaskConfig(name="math500", source=str(MATH500)))
    assert len(s) == 500 and s.answer_kind == "math" and s.id.startswith("math500-")
    first = s.problems[0]
    assert first.question.startswith("Convert the point $(0,3)$")
    assert first.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
