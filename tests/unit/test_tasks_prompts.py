"""render_prompt (chat template and plain) and select_prompts (deterministic, spread, in range)."""

from __future__ import annotations

import string
from collections import Counter

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from protocol.binding import select_prompts
from swarm_node.tasks import DEFAULT_INSTRUCTION, render_prompt

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    """A character-level tokenizer with ChatML specials and a BOS, built offline."""
    chars = sorted(set(string.printable) - set("\x0b\x0c"))
    specials = ["<pad>", "<s>", "<|im_start|>", "<|im_end|>", "<unk>"]
    tk = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(specials + chars)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()
    from tokenizers.processors import TemplateProcessing

    tk.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="<|im_end|>",
                                  unk_token="<unk>", additional_special_tokens=["<|im_start|>"])
    tok.chat_template = chat_template
    return tok


def test_render_with_chat_template() -> None:
    tok = char_tokenizer(CHATML)
    ids = render_prompt(tok, "  What is 2 plus 3? ")
    text = tok.decode(ids)
    assert text == f"<|im_start|>user\nWhat is 2 plus 3?\n{DEFAULT_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")  # no BOS added on top of the template
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 2
    assert "\\boxed{}" in DEFAULT_INSTRUCTION
    custom = tok.decode(render_prompt(tok, "Q?", system_prompt="Answer in a box."))
    assert "Q?\nAnswer in a box.<|im_end|>" in custom and DEFAULT_INSTRUCTION not in custom


def test_render_plain_for_base_models() -> None:
    tok = char_tokenizer(None)
    ids = render_prompt(tok, "What is 2 plus 3?")
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == f"{DEFAULT_INSTRUCTION}\n\nQuestion: What is 2 plus 3?\nAnswer:"


def test_select_prompts_deterministic_distinct_in_range() -> None:
    a = select_prompts("peer-A", 3, 16, 100)
    assert a == select_prompts("peer-A", 3, 16, 100)
    assert len(a) == 16 and len(set(a)) == 16 and all(0 <= i < 100 for i in a)
    assert a != select_prompts("peer-A", 4, 16, 100)
    assert a != select_prompts("peer-B", 3, 16, 100)
    assert a != select_prompts("peer-A", 3, 16, 100, salt="other-set")
    assert sorted(select_prompts("p", 0, 10, 10)) == list(range(10))  # n == size: a permutation
    # fixed values: the function must not change across versions (peers recompute each other's choice)
    assert select_prompts("peer-A", 0, 4, 1000) == [461, 536, 865, 420]
    assert select_prompts("peer-A", 7, 3, 7473, salt="gsm8k-x") == [5637, 3994, 3195]
    assert select_prompts("x", 0, 1, 1) == [0]


def test_select_prompts_more_than_set_size_repeats_whole_permutations() -> None:
    out = select_prompts("peer", 1, 25, 10)
    assert len(out) == 25
    assert sorted(out[:10]) == list(range(10)) and sorted(out[10:20]) == list(range(10))
    assert len(set(out[20:])) == 5


def test_select_prompts_spreads_peers_and_is_uniform() -> None:
    peers = [f"peer-{i}" for i in range(50)]
    firsts = [select_prompts(p, 0, 1, 7473)[0] for p in peers]
    assert len(set(firsts)) >= 48  # distinct peers almost surely get distinct prompts
    counts = Counter(i for step in range(400) for i in select_prompts("peer", step, 5, 10))
    assert set(counts) == set(range(10))
    assert max(counts.values()) - min(counts.values()) < 80  # 200 expected each; loose uniformity bound


def test_select_prompts_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        select_prompts("p", 0, 1, 0)
    with pytest.raises(ValueError):
        select_prompts("p", -1, 1, 5)
    assert select_prompts("p", 0, 0, 5) == []


def test_worked_example_comes_first_in_both_formats() -> None:
    from swarm_node.tasks.prompts import WORKED_EXAMPLE

    q, a = WORKED_EXAMPLE
    chat = char_tokenizer(CHATML)
    text = chat.decode(render_prompt(chat, "What is 2 plus 3?", worked_example=True))
    assert text == (f"<|im_start|>user\n{q}\n{DEFAULT_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n"
                    f"<|im_start|>user\nWhat is 2 plus 3?\n{DEFAULT_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n")
    assert a.count("\\boxed{") == 1  # the example shows exactly the one-answer format the reward accepts
    plain = char_tokenizer(None)
    assert plain.decode(render_prompt(plain, "What is 2 plus 3?", worked_example=True), skip_special_tokens=True) == (
        f"{DEFAULT_INSTRUCTION}\n\nQuestion: {q}\nAnswer: {a}\n\nQuestion: What is 2 plus 3?\nAnswer:")


def test_worked_example_is_no_problem_of_the_default_levels() -> None:
    from swarm_node.tasks.arithmetic import arithmetic_prompt_set
    from swarm_node.tasks.prompts import WORKED_EXAMPLE

    questions = {p.question for p in arithmetic_prompt_set([1, 2], 20_000).problems}
    assert WORKED_EXAMPLE[0] not in questions
