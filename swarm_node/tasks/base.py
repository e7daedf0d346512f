"""Task types: a problem, a prompt set, a reward function."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

AnswerKind = Literal["number", "math"]


@dataclass(frozen=True)
class Problem:
    """One prompt. `question` is the text the model sees (before the chat template); `answer` is
    the gold final answer (GSM8K: the number after ####; MATH: the reference answer string)."""

    index: int
    question: str
    answer: str

    @property
    def sha256(self) -> str:
        """Hash of the question text: the protocol's prompt reference carries it."""
        return hashlib.sha256(self.question.encode()).hexdigest()


@dataclass(frozen=True)
class PromptSet:
    """An ordered, immutable list of problems with a content-derived id."""

    id: str
    answer_kind: AnswerKind
    problems: tuple[Problem, ...]

    def __len__(self) -> int:
        return len(self.problems)


class RewardFn(Protocol):
    def __call__(self, completion_text: str, problem: Problem) -> float: ...


def content_id(task: str, problems: Sequence[Problem]) -> str:
    """A prompt set id, `<task>-<sha256 prefix>` over every problem's question and answer.

    Fields are length-prefixed so no two different lists hash alike by concatenation; nodes that
    load the same data agree on the id, and any change to a problem changes it."""
    h = hashlib.sha256()
    for p in problems:
        for text in (p.question, p.answer):
            data = text.encode()
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
    return f"{task}-{h.hexdigest()[:32]}"
