"""Verifiable rewards: 1.0 for a correct final answer, 0.0 otherwise, plus an optional format bonus.

Which part of a completion is the answer (documented here because it shapes what the model learns):

- the content of the last well-formed `\\boxed{...}` (balanced braces) when there is one;
- otherwise, for `number` answers (GSM8K, arithmetic): the number after the last `####`, and failing
  that the last number in the text; for `math` answers (MATH-500): the tail of the text, which
  math-verify searches for a final expression.

Comparison: when both the gold and the predicted answer read as plain numbers (commas, `$`, `\\$`,
a trailing `.0`, `\\text{...}` units and trailing words removed) they are compared exactly as
rationals, in-process and fast. Anything else (`\\frac`, `\\sqrt`, tuples, intervals, expressions) goes
to math-verify (`parse` + `verify`) in a worker process bounded by `timeout_s`
(`swarm_node.tasks.bounded`): it works from any thread and cannot hang the node. A timed-out, failed
or crashed verification gives reward 0 and is counted (`counters()`).

The format bonus (`format_reward`) is added when exactly one well-formed, non-empty `\\boxed{}`
appears, whatever the answer.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from swarm_node.tasks.base import AnswerKind, Problem
from swarm_node.tasks.bounded import BoundedRunner

MAX_TEXT_CHARS = 32_768  # only the tail of longer completions is read (the answer comes last)
MAX_ANSWER_CHARS = 2_000  # longer extracted answers are not answers; they score 0 without parsing

_BRACE_TOKENS = re.compile(r"\\boxed\s*\{|\\[{}]|[{}]")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_HASHES = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")
_PLAIN_NUMBER = re.compile(r"(-?)(\d+(?:\.\d*)?|\.\d+)")
_TEXT_GROUP = re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{[^{}]*\}")
_TRAILING_WORDS = re.compile(r"^(-?\d[\d.]*)\s*[A-Za-z][A-Za-z .]*$")
_DIGIT = re.compile(r"\d")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")

Source = Literal["boxed", "hashes", "last_number", "text", "none"]
Method = Literal["numeric", "math_verify", "none", "timeout", "error"]

log = logging.getLogger(__name__)


def boxed_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of the content of every well-formed `\\boxed{...}`, in order of their closing brace.

    One linear pass; escaped braces (`\\{`, `\\}`) do not count; unclosed boxes are ignored."""
    stack: list[int] = []  # content start for box openers, -1 for plain braces
    spans: list[tuple[int, int]] = []
    for m in _BRACE_TOKENS.finditer(text):
        tok = m.group()
        if tok.startswith("\\boxed"):
            stack.append(m.end())
        elif tok == "{":
            stack.append(-1)
        elif tok == "}" and stack:
            start = stack.pop()
            if start >= 0:
                spans.append((start, m.start()))
    return spans


def last_boxed(text: str) -> str | None:
    """Content of the last well-formed `\\boxed{}` (the one closed last), or None."""
    spans = boxed_spans(text)
    if not spans:
        return None
    start, end = max(spans, key=lambda s: s[1])
    return text[start:end]


def is_well_formatted(text: str) -> bool:
    """Exactly one well-formed `\\boxed{}` with non-empty content (and no unclosed one)."""
    spans = boxed_spans(text)
    openers = text.count("\\boxed")
    return len(spans) == 1 and openers == 1 and text[spans[0][0]:spans[0][1]].strip() != ""


def extract_answer(text: str, kind: AnswerKind) -> tuple[str | None, Source]:
    """The answer string a completion commits to, and where it came from (see the module docstring)."""
    text = text[-MAX_TEXT_CHARS:]
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, "boxed"
    if kind == "math":
        return (text[-MAX_ANSWER_CHARS:], "text") if text.strip() else (None, "none")
    hashes = _HASHES.findall(text)
    if hashes:
        return hashes[-1], "hashes"
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1], "last_number"
    return None, "none"


def parse_number(answer: str) -> Fraction | None:
    """A plain number written with the usual decorations, as an exact rational; None if it is not one.

    Accepts `1,234`, `$1,234.00`, `\\$5`, `72.0`, `-3`, `1{,}000`, `5 \\text{ apples}`, `72 dollars`, `50\\%`."""
    s = answer.strip()
    if len(s) > 100:
        return None
    s = _TEXT_GROUP.sub("", s).replace("\u2212", "-")  # unicode minus
    for junk in ("\\$", "$", "\\!", "\\,", "\\;", "{,}", "\\%", "%", "^\\circ", "^{\\circ}", "\\left", "\\right"):
        s = s.replace(junk, "")
    s = _THOUSANDS.sub("", s).strip().rstrip(".").strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    m = _TRAILING_WORDS.match(s)
    if m:
        s = m.group(1).rstrip(".")
    m = _PLAIN_NUMBER.fullmatch(s)
    if not m:
        return None
    return Fraction(m.group(2)) * (-1 if m.group(1) else 1)


def _verify_with_math_verify(gold: str, prediction: str) -> bool:
    """Runs in the bounded worker: math-verify parse + verify, without its signal-based timeouts
    (the worker's caller bounds the time)."""
    from math_verify import parse, verify  # noqa: PLC0415  (imported in the worker process)

    # math-verify warns on every call that its own timeouts are off; here that is by design.
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    gold_parsed = parse(gold, parsing_timeout=None)
    pred_parsed = parse(prediction, parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _warm_math_verify() -> None:
    """Exercise the lazy parts of math-verify and sympy once (fractions, roots, tuples), so the
    first real verification is not charged their import and compile time."""
    for gold, prediction in (("\\boxed{\\frac{1}{2}}", "\\boxed{0.5}"), ("\\boxed{2\\sqrt{2}}", "\\boxed{\\sqrt{8}}"),
                             ("\\boxed{(1, \\pi)}", "\\boxed{(1, \\pi)}")):
        _verify_with_math_verify(gold, prediction)


def math_verify_runner(timeout_s: float) -> BoundedRunner:
    """A bounded worker with math-verify imported and warmed up (reward functions may share one)."""
    return BoundedRunner(timeout_s, preload=("math_verify",), warmup=(_warm_math_verify, ()))


@dataclass(frozen=True)
class Score:
    """One scored completion: correctness, the format bonus, and how the verdict was reached."""

    correct: bool
    formatted: bool
    source: Source
    method: Method
    reward: float


class CorrectnessReward:
    """The task reward: `reward_fn(completion_text, problem) -> float` (see the module docstring).

    Thread-safe. `verify_fn` (a picklable module-level function (gold, prediction) -> bool) is the
    slow path, run in `runner` (a math-verify worker by default; several reward functions may
    share one) with at most `timeout_s` per call; tests replace it."""

    def __init__(
        self,
        answer_kind: AnswerKind,
        *,
        format_reward: float = 0.0,
        timeout_s: float = 5.0,
        verify_fn: Callable[[str, str], bool] = _verify_with_math_verify,
        runner: BoundedRunner | None = None,
    ) -> None:
        if not 0.0 <= format_reward <= 1.0:
            raise ValueError(f"format_reward must be in [0, 1], got {format_reward}")
        self.answer_kind = answer_kind
        self.format_reward = format_reward
        self.verify_fn = verify_fn
        self.timeout_s = timeout_s
        self.runner = runner or math_verify_runner(timeout_s)
        self._counts = {"calls": 0, "correct": 0, "numeric": 0, "math_verify": 0, "no_answer": 0,
                        "timeouts": 0, "errors": 0}
        self._lock = threading.Lock()

    def __call__(self, completion_text: str, problem: Problem) -> float:
        return self.score(completion_text, problem).reward

    def score(self, completion_text: str, problem: Problem) -> Score:
        answer, source = extract_answer(completion_text, self.answer_kind)
        formatted = is_well_formatted(completion_text[-MAX_TEXT_CHARS:])
        correct, method = self._judge(answer, source, problem.answer)
        reward = (1.0 if correct else 0.0) + (self.format_reward if formatted else 0.0)
        with self._lock:
            self._counts["calls"] += 1
            self._counts["correct"] += int(correct)
            key = {"none": "no_answer", "timeout": "timeouts", "error": "errors"}.get(method, method)
            self._counts[key] += 1
        return Score(correct=correct, formatted=formatted, source=source, method=method, reward=reward)

    def _judge(self, answer: str | None, source: Source, gold: str) -> tuple[bool, Method]:
        if answer is None or not answer.strip() or len(answer) > MAX_ANSWER_CHARS:
            return False, "none"
        gold_num = parse_number(gold)
        pred_num = parse_number(answer)
        if gold_num is not None and pred_num is not None:
            return gold_num == pred_num, "numeric"
        if self.answer_kind == "number" and gold_num is not None and not _DIGIT.search(answer):
            return False, "numeric"  # words ("seventy-two", "x") cannot equal a numeric gold here
        prediction = answer if source == "text" else f"\\boxed{{{answer}}}"
        outcome = self.runner.call(self.verify_fn, f"\\boxed{{{gold}}}", prediction, timeout_s=self.timeout_s)
        if outcome.status == "ok":
            return bool(outcome.value), "math_verify"
        if outcome.status == "timeout":
            return False, "timeout"
        # Untrusted text broke the verifier (exception or dead worker): score 0, count, keep going.
        log.warning("answer verification %s: %s", outcome.status, outcome.detail.strip().splitlines()[-1:])
        return False, "error"

    def counters(self) -> dict[str, int]:
        """Totals since construction: calls, correct, numeric, math_verify, no_answer, timeouts, errors."""
        with self._lock:
            return dict(self._counts)

    def close(self) -> None:
        self.runner.close()
