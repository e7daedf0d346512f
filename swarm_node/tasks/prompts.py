"""Turning a problem into prompt tokens, and choosing which problems a peer works on at a step.

`select_prompts` is a pure function of (salt, peer id, counter) built on sha256, so every node can
recompute any peer's choice and the result is the same on every platform and Python version;
different peers get (almost surely) different prompts. A node in a swarm takes its prompts with
`window_prompts` (the counter is the DHT time window its step starts in, never a number the peer
picks: see `swarm_node.swarm.binding`); a node training alone counts its steps.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

DEFAULT_INSTRUCTION = "Reason briefly, then put your final answer within \\boxed{}."

# One solved problem shown before the question (`task.worked_example`): it shows the one answer
# format the reward accepts. Its numbers lie outside arithmetic levels 1 and 2 (12 is two-digit, 5
# one-digit), so it is never one of the default task's problems.
WORKED_EXAMPLE: tuple[str, str] = ("What is 12 plus 5?", "12 plus 5 is 17. The answer is \\boxed{17}.")


def _user_text(question: str, instruction: str) -> str:
    return f"{question.strip()}\n{instruction}"


def render_prompt(tokenizer: Any, question: str, system_prompt: str | None = None,
                  worked_example: bool = False) -> list[int]:
    """Prompt token ids for `question`.

    With a chat template: one user turn (question, then the instruction) rendered with
    `add_generation_prompt=True`; the instruction goes in the user turn because not every template
    accepts a system role. Without one (base models): `Question: ...\\nAnswer:` text after the
    instruction. `system_prompt` replaces DEFAULT_INSTRUCTION when given. `worked_example`: the
    WORKED_EXAMPLE exchange (a user turn and the assistant's answer, or one more Question/Answer
    pair) comes first, so the model sees the answer format once before its own question."""
    instruction = system_prompt if system_prompt is not None else DEFAULT_INSTRUCTION
    example_q, example_a = WORKED_EXAMPLE
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": _user_text(question, instruction)}]
        if worked_example:
            messages = [{"role": "user", "content": _user_text(example_q, instruction)},
                        {"role": "assistant", "content": example_a}, *messages]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template already wrote any BOS/role tokens as text; adding special tokens would double them.
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    shown = f"Question: {example_q}\nAnswer: {example_a}\n\n" if worked_example else ""
    text = f"{instruction}\n\n{shown}Question: {question.strip()}\nAnswer:"
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


class _HashStream:
    """Uniform integers from sha256 in counter mode: portable and reproducible."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.counter = 0

    def below(self, bound: int) -> int:
        """Uniform in [0, bound) by rejection sampling on 64-bit draws (no modulo bias)."""
        limit = (1 << 64) - (1 << 64) % bound
        while True:
            digest = hashlib.sha256(self.key + self.counter.to_bytes(8, "little")).digest()
            self.counter += 1
            value = int.from_bytes(digest[:8], "little")
            if value < limit:
                return value % bound


def _partial_shuffle(stream: _HashStream, k: int, size: int) -> list[int]:
    """First k entries of a Fisher-Yates shuffle of range(size), in O(k) memory (sparse swaps)."""
    swapped: dict[int, int] = {}
    out = []
    for i in range(k):
        j = i + stream.below(size - i)
        out.append(swapped.get(j, j))
        swapped[j] = swapped.get(i, i)
    return out


def select_prompts(peer_id: str, step: int, n: int, set_size: int, salt: str = "") -> list[int]:
    """The `n` problem indices peer `peer_id` works on at `step`: distinct when n <= set_size
    (otherwise whole permutations of the set follow each other), all in [0, set_size).

    `salt` separates swarms or prompt sets (e.g. the prompt set id), so a peer's sequence differs
    between them."""
    if set_size < 1:
        raise ValueError(f"set_size must be >= 1, got {set_size}")
    if n < 0 or step < 0:
        raise ValueError(f"n and step must be >= 0, got n={n}, step={step}")
    out: list[int] = []
    round_no = 0
    while len(out) < n:
        key = json.dumps(["select-prompts", salt, peer_id, step, round_no]).encode()  # unambiguous fields
        take = min(n - len(out), set_size)
        out.extend(_partial_shuffle(_HashStream(hashlib.sha256(key).digest()), take, set_size))
        round_no += 1
    return out


def window_prompts(peer_id: str, window: int, slot: int, n: int, set_size: int, salt: str = "") -> list[int]:
    """The `n` prompts of the `slot`-th step (0, 1, ...) that peer `peer_id` starts in DHT time
    window `window`: entries [slot * n, (slot + 1) * n) of `select_prompts(peer_id, window, ...)`.

    The protocol's prompt binding (`swarm_node.swarm.binding`): a receiver accepts a peer's group
    in window w only on a prompt among the first `n * slots_per_window` of that sequence, which no
    field the peer chooses can change. `select_prompts` is prefix-consistent (a longer request
    extends a shorter one), so slot k's prompts never change with how many slots follow."""
    if slot < 0:
        raise ValueError(f"slot must be >= 0, got {slot}")
    return select_prompts(peer_id, window, n * (slot + 1), set_size, salt=salt)[n * slot:]
