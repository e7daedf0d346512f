"""The built-in procedural arithmetic task: short word problems with integer answers.

Offline and unlimited: problem `index` of a set is a pure function of (seed, level, index), so
every node that uses the same seed and levels builds the same set, and any index can be generated
on demand. Difficulty levels (answers are always non-negative integers):

    1  single-digit addition or subtraction, one sentence of story
    2  two-digit addition or subtraction
    3  multiplication (one or two digits times one digit), or a*b +/- c
    4  two-step word problems (buy k packs of m, then give some away, ...)
    5+ multi-step problems (three or more operations, exact division); numbers grow with the level

Wording `unseen` (levels 1-2 only) asks the same kind of question in other sentences, used by no
training or warm-up set: an out-of-distribution evaluation set that tests new wording of a known
skill (its problems are drawn from their own stream, so they are also other questions).

Level 1 exists because a 135M-parameter chat model solves it only sometimes: GRPO learns only
from groups whose rewards differ.

Final answer (`swarm_node.tasks.answers`, the same for own and peer samples): exactly one
`\\boxed{<number>}`; no other marker counts, so a bare number, a second box, or a hedged box
(`\\boxed{7 \\text{(or 8)}}`, `\\boxed{7 = 8}`) scores 0.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

from swarm_node.tasks.base import Problem, PromptSet, content_id

MAX_LEVEL = 9
FINAL_ANSWER_MARKERS: tuple[str, ...] = ()  # a box is required

_NAMES = ("Tom", "Anna", "Ben", "Lily", "Sam", "Maya", "Leo", "Emma", "Omar", "Zoe", "Ivan", "Nina")
_ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "stamps", "shells", "coins", "cards")
_CONTAINERS = ("boxes", "bags", "packs", "jars", "baskets")

Generated = tuple[str, int]  # (question text, integer answer)
WORDINGS = ("standard", "unseen")


def _pick(rng: random.Random, seq: Sequence[str]) -> str:
    return seq[rng.randrange(len(seq))]


def _two_names(rng: random.Random) -> tuple[str, str]:
    first = _pick(rng, _NAMES)
    second = _pick(rng, [n for n in _NAMES if n != first])
    return first, second


def _add_sub(rng: random.Random, lo: int, hi: int, direct_share: float) -> Generated:
    """One addition or subtraction, numbers in [lo, hi]: a direct question ("What is 3 plus 4?")
    with probability `direct_share`, else one of two short stories."""
    name, other = _two_names(rng)
    item = _pick(rng, _ITEMS)
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    direct = rng.random() < direct_share
    story = rng.randrange(2)
    if rng.random() < 0.5:
        if direct:
            q = f"What is {a} plus {b}?"
        elif story == 0:
            q = f"{name} has {a} {item}. {other} gives {name} {b} more. How many {item} does {name} have now?"
        else:
            q = f"There are {a} {item} on a table and {b} {item} in a bag. How many {item} are there in total?"
        return q, a + b
    a, b = max(a, b), min(a, b)
    if direct:
        q = f"What is {a} minus {b}?"
    elif story == 0:
        q = f"{name} has {a} {item}. {name} gives {b} of them to {other}. How many {item} does {name} have left?"
    else:
        q = f"A jar holds {a} {item}. {name} takes out {b}. How many {item} are still in the jar?"
    return q, a - b


def _add_sub_unseen(rng: random.Random, lo: int, hi: int) -> Generated:
    """One addition or subtraction in sentences no `standard` problem uses."""
    name = _pick(rng, _NAMES)
    item = _pick(rng, _ITEMS)
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    story = rng.randrange(2)
    if rng.random() < 0.5:
        if story == 0:
            q = f"{name} found {a} {item} in the morning and {b} {item} in the evening. How many {item} did {name} find in all?"
        else:
            q = f"Add {b} {item} to a pile of {a} {item}. How big is the pile?"
        return q, a + b
    a, b = max(a, b), min(a, b)
    if story == 0:
        q = f"{name} had {a} {item} and lost {b} of them on the way home. How many {item} remain?"
    else:
        q = f"Of {a} {item}, {b} are red and the rest are blue. How many {item} are blue?"
    return q, a - b


_LEVEL_RANGES = {1: (1, 9), 2: (10, 99)}


def _level1(rng: random.Random, level: int) -> Generated:
    # The embedded 135M model solves direct questions far more often than stories: keep it learnable.
    return _add_sub(rng, *_LEVEL_RANGES[1], direct_share=0.6)


def _level2(rng: random.Random, level: int) -> Generated:
    return _add_sub(rng, *_LEVEL_RANGES[2], direct_share=1 / 3)


def _level3(rng: random.Random, level: int) -> Generated:
    name = _pick(rng, _NAMES)
    item = _pick(rng, _ITEMS)
    box = _pick(rng, _CONTAINERS)
    a, b = rng.randint(2, 9), rng.randint(2, 12 if rng.random() < 0.5 else 9)
    template = rng.randrange(3)
    if template == 0:
        return f"{name} has {a} {box} with {b} {item} in each. How many {item} does {name} have?", a * b
    if template == 1:
        return f"What is {a} times {b}?", a * b
    c = rng.randint(1, 9)
    if rng.random() < 0.5:
        return f"What is {a} times {b} plus {c}?", a * b + c
    c = min(c, a * b)
    return f"What is {a} times {b} minus {c}?", a * b - c


def _level4(rng: random.Random, level: int) -> Generated:
    name, other = _two_names(rng)
    item = _pick(rng, _ITEMS)
    box = _pick(rng, _CONTAINERS)
    start, k, m = rng.randint(2, 20), rng.randint(2, 6), rng.randint(2, 10)
    template = rng.randrange(3)
    if template == 0:
        q = (f"{name} has {start} {item}. {name} buys {k} {box} with {m} {item} in each. "
             f"How many {item} does {name} have now?")
        return q, start + k * m
    if template == 1:
        total = start + k * m
        give = rng.randint(1, total)
        q = (f"{name} buys {k} {box} of {item} with {m} in each, then has {start} more from {other}. "
             f"{name} gives away {give}. How many {item} are left?")
        return q, total - give
    price, count = rng.randint(2, 9), rng.randint(2, 9)
    paid = price * count + rng.randint(0, 20)
    q = (f"{name} buys {count} {item} at {price} dollars each and pays with {paid} dollars. "
         f"How much change does {name} get?")
    return q, paid - price * count


def _level_multi(rng: random.Random, level: int) -> Generated:
    """Three or more operations; number ranges grow with the level. Division is always exact."""
    name, other = _two_names(rng)
    item = _pick(rng, _ITEMS)
    box = _pick(rng, _CONTAINERS)
    scale = 10 ** max(1, level - 4)  # level 5: up to 2 digits, level 6: 3 digits, ...
    k, m = rng.randint(2, 9), rng.randint(2, min(99, scale))
    people = rng.randint(2, 6)
    template = rng.randrange(2)
    if template == 0:
        extra = rng.randint(0, scale) * people
        total = k * m * people + extra
        friends = "1 friend" if people == 2 else f"{people - 1} friends"
        q = (f"{name} buys {k * people} {box} with {m} {item} in each and finds {extra} more {item}. "
             f"{name} and {friends} share them all equally. How many {item} does each person get?")
        return q, total // people
    start = rng.randint(scale, 5 * scale)
    gained = k * m
    lost = rng.randint(0, start + gained)
    q = (f"A shop has {start} {item}. It receives {k} {box} of {m} {item}, then sells {lost} {item}. "
         f"{other} buys half of the rest, rounded down. How many {item} does the shop have now?")
    rest = start + gained - lost
    return q, rest - rest // 2


_GENERATORS: dict[int, Callable[[random.Random, int], Generated]] = {1: _level1, 2: _level2, 3: _level3, 4: _level4}


def arithmetic_problem(seed: int, level: int, index: int, wording: str = "standard") -> Problem:
    """Problem `index` of the given level, deterministic across processes and platforms: the
    Mersenne Twister stream is seeded from a sha256 of the arguments, not from Python's salted hash
    (CPython keeps seeding, randrange and random stable across versions)."""
    if not 1 <= level <= MAX_LEVEL:
        raise ValueError(f"arithmetic level must be in 1..{MAX_LEVEL}, got {level}")
    if wording not in WORDINGS:
        raise ValueError(f"arithmetic wording must be one of {', '.join(WORDINGS)}, got {wording!r}")
    if wording == "unseen" and level not in _LEVEL_RANGES:
        raise ValueError(f"arithmetic wording 'unseen' exists for levels 1-2 only, got level {level}")
    key = f"arithmetic|{seed}|{level}|{index}" + ("" if wording == "standard" else f"|{wording}")
    digest = hashlib.sha256(key.encode()).digest()
    rng = random.Random(int.from_bytes(digest[:16], "little"))
    if wording == "unseen":
        question, answer = _add_sub_unseen(rng, *_LEVEL_RANGES[level])
    else:
        question, answer = _GENERATORS.get(level, _level_multi)(rng, level)
    return Problem(index=index, question=question, answer=str(answer))


def arithmetic_prompt_set(levels: Sequence[int], size: int, seed: int = 0, wording: str = "standard") -> PromptSet:
    """`size` problems cycling through `levels` (problem i has level levels[i % len(levels)]).

    The id hashes the generated problems, so two nodes agree on it exactly when they hold the same set."""
    if not levels:
        raise ValueError("arithmetic task needs at least one level")
    if size < 1:
        raise ValueError(f"arithmetic set size must be >= 1, got {size}")
    problems = tuple(arithmetic_problem(seed, levels[i % len(levels)], i, wording) for i in range(size))
    return PromptSet(id=content_id("arithmetic", problems), answer_kind="number", problems=problems)

