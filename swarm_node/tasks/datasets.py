"""GSM8K and MATH-500 prompt sets, from a local jsonl file or (when `datasets` is installed) the hub.

A local path is what offline machines use (`../shared/data/gsm8k/train.jsonl`,
`../shared/data/math500/test.jsonl`); a hub id (`openai/gsm8k`, `HuggingFaceH4/MATH-500`) needs the
`datasets` package and network access. Both give the same field names, so one row parser serves
both. The set id hashes the loaded problems, so nodes that loaded the same data agree on it.

Final answers (`swarm_node.tasks.answers`, the same for own and peer samples): GSM8K accepts
exactly one of `\\boxed{<number>}` or the dataset's own marker `#### <number>` (both at once are two
answers); MATH-500 requires exactly one `\\boxed{...}`. A hedged or multi-valued answer scores 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from swarm_node.tasks.base import Problem, PromptSet, content_id

GSM8K_HUB_ID = "openai/gsm8k"
MATH500_HUB_ID = "HuggingFaceH4/MATH-500"
GSM8K_MARKERS: tuple[str, ...] = ("####",)
MATH500_MARKERS: tuple[str, ...] = ()

_GSM8K_GOLD = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


class DatasetUnavailable(RuntimeError):
    """The requested source can neither be read locally nor loaded from the hub."""


def gsm8k_gold(answer_field: str) -> str:
    """The gold answer of a GSM8K row: the number after the last `####`, commas removed."""
    matches = _GSM8K_GOLD.findall(answer_field)
    if not matches:
        raise ValueError(f"GSM8K answer has no '#### <number>' line: {answer_field[-80:]!r}")
    return matches[-1].replace(",", "")


def _gsm8k_problem(i: int, row: Mapping[str, Any]) -> Problem:
    return Problem(index=i, question=str(row["question"]).strip(), answer=gsm8k_gold(str(row["answer"])))


def _math500_problem(i: int, row: Mapping[str, Any]) -> Problem:
    answer = str(row["answer"]).strip()
    if not answer:
        raise ValueError(f"MATH-500 row {i} has an empty answer")
    return Problem(index=i, question=str(row["problem"]).strip(), answer=answer)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a jsonl file (blank lines skipped); a malformed line raises with its line number."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
    return rows


def _looks_local(source: str) -> bool:
    return source.endswith((".jsonl", ".json")) or source.startswith((".", "/", "~")) or Path(source).exists()


def _hub_rows(hub_id: str, config: str | None, split: str, local_hint: str) -> Iterable[Mapping[str, Any]]:
    try:
        import datasets  # noqa: PLC0415  (optional dependency, imported only for hub ids)
    except ImportError as e:
        raise DatasetUnavailable(
            f"loading {hub_id!r} from the hub needs the `datasets` package (pip install datasets) and "
            f"network access; offline, pass a local jsonl file instead, e.g. task.source={local_hint!r}"
        ) from e
    try:
        if config:
            return datasets.load_dataset(hub_id, config, split=split)
        return datasets.load_dataset(hub_id, split=split)
    except (OSError, ConnectionError, ValueError) as e:  # network boundary: unreachable hub, unknown split
        raise DatasetUnavailable(
            f"could not load {hub_id!r} (split {split!r}) from the hub: {e}; "
            f"offline, pass a local jsonl file instead, e.g. task.source={local_hint!r}"
        ) from e


def _rows(source: str, hub_id: str, config: str | None, split: str, local_hint: str) -> Iterable[Mapping[str, Any]]:
    if _looks_local(source):
        path = Path(source).expanduser()
        if not path.is_file():
            raise DatasetUnavailable(f"local data file {str(path)!r} does not exist")
        return read_jsonl(path)
    return _hub_rows(source, config, split, local_hint)


def load_gsm8k(source: str = GSM8K_HUB_ID, split: str = "train", limit: int | None = None) -> PromptSet:
    """GSM8K as a prompt set (answer kind `number`). `source`: a jsonl path or a hub id (config `main`)."""
    rows = _rows(source, GSM8K_HUB_ID, "main", split, "../shared/data/gsm8k/train.jsonl")
    problems = _take(rows, _gsm8k_problem, limit)
    return PromptSet(id=content_id("gsm8k", problems), answer_kind="number", problems=problems)


def load_math500(source: str = MATH500_HUB_ID, split: str = "test", limit: int | None = None) -> PromptSet:
    """MATH-500 as a prompt set (answer kind `math`). `source`: a jsonl path or a hub id."""
    rows = _rows(source, MATH500_HUB_ID, None, split, "../shared/data/math500/test.jsonl")
    problems = _take(rows, _math500_problem, limit)
    return PromptSet(id=content_id("math500", problems), answer_kind="math", problems=problems)


RowParser = Callable[[int, Mapping[str, Any]], Problem]


def _take(rows: Iterable[Mapping[str, Any]], make: RowParser, limit: int | None) -> tuple[Problem, ...]:
    out = []
    for i, row in enumerate(rows):
        if limit is not None and i >= limit:
            break
        if not isinstance(row, Mapping):
            raise ValueError(f"row {i + 1} is not a JSON object")
        try:
            out.append(make(i, row))
        except KeyError as e:
            raise ValueError(f"row {i + 1} has no {e.args[0]!r} field (its fields: {', '.join(map(str, row))})") from e
    if not out:
        raise ValueError("the data source holds no problems")
    return tuple(out)
