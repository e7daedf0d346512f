"""Turning a problem into prompt tokens. Which problems a peer works on at a step is a protocol
rule: `protocol.binding` (`select_prompts`, `window_prompts`).
"""

from __future__ import annotations

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
