"""What a completion's answer is: exactly one final answer, single-valued, and cheap to verify.

The rules (the same for own and peer samples; the task modules say which markers they accept):

1. **Exactly one final answer.** A completion commits to an answer with one `\\boxed{...}` or, where
   the task allows it, one final-answer marker (GSM8K: `#### <number>`). No answer (a bare number,
   unboxed LaTeX), two boxes (`\\boxed{w} \\boxed{g}`, even two equal ones), a box plus a marker, or a
   box left unclosed next to another: no answer, reward 0.
2. **One value.** The answer must name one value: a `\\text{...}` aside holding a number or a hedge
   word (`\\boxed{g \\text{(or w)}}`), the words `or`/`and`, `\\pm`, `\\lor`, `;`, a relation
   (`\\approx`, `<`, `\\le`, ...), or an equation (`\\boxed{w = g}`) make it hedged, reward 0. A
   construct the gold answer itself uses is allowed (a gold `\\pm` admits `\\pm`). One exception for
   equations: a plain variable on the left (`\\boxed{x = 5}`) names the right-hand side.
3. **Pre-screened before the verifier.** Answers that go to math-verify (not plain numbers) and
   contain what makes sympy run for seconds or forever, and never appears in a gold answer of the
   task when the gold does not have it - factorials (`!`), exponent towers (`9^{9^9}`), exponents
   of 4+ digits, literals of 40+ digits, sums, products, integrals, limits - or that are much longer
   than the gold answer, score 0 without running the verifier (`prescreen`).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Literal

from swarm_node.tasks.base import AnswerKind

MAX_TEXT_CHARS = 32_768  # only the tail of longer completions is read (the answer comes last)
MAX_ANSWER_CHARS = 2_000  # longer extracted answers are not answers; they score 0 without parsing
HASHES = "####"

_BRACE_TOKENS = re.compile(r"\\boxed\s*\{|\\[{}]|[{}]")
_HASHES = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")
_PLAIN_NUMBER = re.compile(r"(-?)(\d+(?:\.\d*)?|\.\d+)")
_TEXT_GROUP = re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{([^{}]*)\}")
_TRAILING_WORDS = re.compile(r"^(-?\d[\d.]*)\s*[A-Za-z][A-Za-z .]*$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_HEDGE_WORDS = re.compile(r"\b(?:or|and|either|maybe|possibly|perhaps|approx\w*|about)\b", re.IGNORECASE)
_DIGIT = re.compile(r"\d")
_VARIABLE = re.compile(r"\s*(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?\w+\}?)?\s*")
# Constructs that make an answer multi-valued or a relation, unless the gold answer has them too.
_MULTI = tuple(re.compile(p) for p in (
    r"\\pm(?![A-Za-z])", r"\\mp(?![A-Za-z])", r"\\lor(?![A-Za-z])", r"\\vee(?![A-Za-z])", r";",
    r"\\approx(?![A-Za-z])", r"\\neq?(?![A-Za-z])", r"\\[lg]eq?(?![A-Za-z])", r"\\sim(?![A-Za-z])", r"[<>]"))
# Constructs that make sympy slow, unless the gold answer has them too (`\!` is a thin space, not `!`).
_SLOW = tuple((re.compile(p), name) for p, name in (
    (r"(?<!\\)!", "factorial"), (r"\\sum(?![A-Za-z])", "sum"), (r"\\prod(?![A-Za-z])", "product"),
    (r"\\int(?![A-Za-z])", "integral"), (r"\\lim(?![A-Za-z])", "limit"), (r"\\binom(?![A-Za-z])", "binomial"),
    (r"\\Gamma(?![A-Za-z])", "gamma")))
_TOWER = re.compile(r"\^\s*\{[^{}]*\^|\^\s*[\w.]+\s*\^|\^\s*\{[^{}]*\{[^{}]*\^")
_BIG_EXPONENT = re.compile(r"\^\s*\{?\s*-?\d{4,}")
_BIG_LITERAL = re.compile(r"\d{40,}")

Source = Literal["boxed", "hashes", "none"]
Refusal = Literal["multiple_answers", "hedged"]


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


def extract_answer(text: str, kind: AnswerKind, markers: tuple[str, ...] = ()) -> tuple[str | None, Source]:
    """The one final answer a completion commits to and where it came from, or (None, "none") when
    it commits to none or to more than one (rule 1 of the module docstring). `kind` is accepted for
    symmetry with the reward; both kinds follow the same rule."""
    del kind
    text = text[-MAX_TEXT_CHARS:]
    openers = text.count("\\boxed")
    hashes = _HASHES.findall(text) if HASHES in markers else []
    if openers + len(hashes) != 1:
        return None, "none"
    if hashes:
        return hashes[0], "hashes"
    spans = boxed_spans(text)
    if len(spans) != 1:
        return None, "none"
    start, end = spans[0]
    return text[start:end], "boxed"


def single_value(answer: str, gold: str) -> str | None:
    """The answer as one value (rule 2), or None when it is hedged or multi-valued. A plain variable
    assignment (`x = 5`) gives its right-hand side."""
    for m in _TEXT_GROUP.finditer(answer):
        aside = m.group(1)
        if (_DIGIT.search(aside) or _HEDGE_WORDS.search(aside)) and aside.strip() not in gold:
            return None
    bare = _TEXT_GROUP.sub(" ", answer)
    if _HEDGE_WORDS.search(bare) and not _HEDGE_WORDS.search(gold):
        return None
    if any(op.search(bare) and not op.search(gold) for op in _MULTI):
        return None
    if "=" in answer and "=" not in gold:
        lhs, _, rhs = answer.partition("=")
        if "=" in rhs or not _VARIABLE.fullmatch(lhs) or not rhs.strip():
            return None  # both sides of an equation, or a chain: not one value
        return rhs.strip()
    return answer


def prescreen(answer: str, gold: str) -> str | None:
    """Why `answer` must not reach the verifier (rule 3), or None. Cheap: a few regex scans."""
    if len(answer) > max(64, 4 * len(gold)):
        return "too_long"
    for pattern, name in _SLOW:
        if pattern.search(answer) and not pattern.search(gold):
            return name
    if (_TOWER.search(answer) and not _TOWER.search(gold)) or answer.count("^") > gold.count("^") + 2:
        return "tower"
    if _BIG_EXPONENT.search(answer) and not _BIG_EXPONENT.search(gold):
        return "big_exponent"
    if _BIG_LITERAL.search(answer) and not _BIG_LITERAL.search(gold):
        return "big_literal"
    return None


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
