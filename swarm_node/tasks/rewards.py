"""Verifiable rewards: 1.0 for a correct final answer, 0.0 otherwise, plus an optional format bonus.

Which part of a completion is the answer, and when it counts as one answer, is decided in
`swarm_node.tasks.answers` (exactly one `\\boxed{}` or task marker; one value, not hedged; screened
before the verifier). The rules are the same for own and peer samples.

Comparison: when both the gold and the predicted answer read as plain numbers (commas, `$`, `\\$`,
a trailing `.0`, `\\text{...}` units and trailing words removed) they are compared exactly as
rationals, in-process and fast. Anything else (`\\frac`, `\\sqrt`, tuples, intervals, expressions) goes,
once pre-screened, to math-verify (`parse` + `verify`) in a worker process bounded by `timeout_s`
(`swarm_node.tasks.bounded`): it works from any thread and cannot hang the node. Peers' answers
(`score(..., peer=True)`) use a worker of their own, so a hostile answer that runs into the
timeout (and costs a worker restart) never delays the scoring of own samples. A timed-out, failed
or crashed verification gives reward 0 and is counted (`counters()`).

The format bonus (`format_reward`) is added when exactly one well-formed, non-empty `\\boxed{}`
appears, whatever the answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from swarm_node.tasks.answers import (  # noqa: F401  (re-exported: the reward's public surface)
    MAX_ANSWER_CHARS,
    MAX_TEXT_CHARS,
    boxed_spans,
    extract_answer,
    is_well_formatted,
    last_boxed,
    parse_number,
    prescreen,
    single_value,
)
from swarm_node.tasks.answers import Source as Source
from swarm_node.tasks.base import AnswerKind, Problem
from swarm_node.tasks.bounded import BoundedRunner

Method = Literal["numeric", "math_verify", "none", "hedged", "prescreened", "timeout", "error"]

_DIGIT_CHARS = frozenset("0123456789")

log = logging.getLogger(__name__)


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

    Thread-safe. `markers` are the final-answer markers the task accepts besides a box (GSM8K:
    `("####",)`). `verify_fn` (a picklable module-level function (gold, prediction) -> bool) is the
    slow path, run in `runner` (a math-verify worker by default; several reward functions may
    share one) with at most `timeout_s` per call; tests replace it. Peers' answers run in a second
    worker, started on first use (the same `runner` when one is passed in)."""

    def __init__(
        self,
        answer_kind: AnswerKind,
        *,
        format_reward: float = 0.0,
        timeout_s: float = 5.0,
        markers: tuple[str, ...] = (),
        verify_fn: Callable[[str, str], bool] = _verify_with_math_verify,
        runner: BoundedRunner | None = None,
    ) -> None:
        if not 0.0 <= format_reward <= 1.0:
            raise ValueError(f"format_reward must be in [0, 1], got {format_reward}")
        self.answer_kind = answer_kind
        self.format_reward = format_reward
        self.markers = tuple(markers)
        self.verify_fn = verify_fn
        self.timeout_s = timeout_s
        self.runner = runner or math_verify_runner(timeout_s)
        self._peer_runner: BoundedRunner | None = runner
        self._counts = {"calls": 0, "correct": 0, "numeric": 0, "math_verify": 0, "no_answer": 0, "hedged": 0,
                        "prescreened": 0, "timeouts": 0, "errors": 0}
        self._lock = threading.Lock()

    def __call__(self, completion_text: str, problem: Problem) -> float:
        return self.score(completion_text, problem).reward

    def score(self, completion_text: str, problem: Problem, *, peer: bool = False,
              timeout_s: float | None = None) -> Score:
        """Score one completion; `peer` picks the peers' worker, `timeout_s` lowers the verifier's
        bound for this call (a caller's remaining time budget)."""
        answer, source = extract_answer(completion_text, self.answer_kind, self.markers)
        formatted = is_well_formatted(completion_text[-MAX_TEXT_CHARS:])
        bound = self.timeout_s if timeout_s is None else max(1e-3, min(self.timeout_s, timeout_s))
        correct, method = self._judge(answer, problem.answer, self._runner_for(peer), bound)
        reward = (1.0 if correct else 0.0) + (self.format_reward if formatted else 0.0)
        with self._lock:
            self._counts["calls"] += 1
            self._counts["correct"] += int(correct)
            key = {"none": "no_answer", "timeout": "timeouts", "error": "errors"}.get(method, method)
            self._counts[key] += 1
        return Score(correct=correct, formatted=formatted, source=source, method=method, reward=reward)

    def start_peer_worker(self) -> None:
        """Launch the peers' worker in the background (a node that exchanges calls this at start),
        so the first peer verification is not charged the worker's startup."""
        self._runner_for(True).launch()

    def ready_peer_worker(self) -> None:
        """Wait until the peers' worker is up (starting it if need be): a verifier calls this before
        it starts a peer's clock, so the worker's startup is never charged to a peer's budget."""
        self._runner_for(True).start()

    def _runner_for(self, peer: bool) -> BoundedRunner:
        if not peer:
            return self.runner
        with self._lock:
            if self._peer_runner is None:
                self._peer_runner = math_verify_runner(self.timeout_s)
            return self._peer_runner

    def _judge(self, answer: str | None, gold: str, runner: BoundedRunner, bound: float) -> tuple[bool, Method]:
        if answer is None or not answer.strip() or len(answer) > MAX_ANSWER_CHARS:
            return False, "none"
        value = single_value(answer, gold)
        if value is None:
            return False, "hedged"
        gold_num = parse_number(gold)
        pred_num = parse_number(value)
        if gold_num is not None and pred_num is not None:
            return gold_num == pred_num, "numeric"
        if self.answer_kind == "number" and gold_num is not None and not _DIGIT_CHARS.intersection(value):
            return False, "numeric"  # words ("seventy-two", "x") cannot equal a numeric gold here
        if prescreen(value, gold) is not None:
            return False, "prescreened"
        outcome = runner.call(self.verify_fn, f"\\boxed{{{gold}}}", f"\\boxed{{{value}}}", timeout_s=bound)
        if outcome.status == "ok":
            return bool(outcome.value), "math_verify"
        if outcome.status == "timeout":
            return False, "timeout"
        # Untrusted text broke the verifier (exception or dead worker): score 0, count, keep going.
        log.warning("answer verification %s: %s", outcome.status, outcome.detail.strip().splitlines()[-1:])
        return False, "error"

    def counters(self) -> dict[str, int]:
        """Totals since construction: calls, correct, numeric, math_verify, no_answer, hedged,
        prescreened, timeouts, errors."""
        with self._lock:
            return dict(self._counts)

    def close(self) -> None:
        self.runner.close()
        if self._peer_runner is not None and self._peer_runner is not self.runner:
            self._peer_runner.close()
