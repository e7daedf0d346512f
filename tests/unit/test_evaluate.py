"""Greedy evaluation through the generator: exact numbers on a scripted model, consistency on a tiny
random Llama, and the hf backend's greedy loop (swarm_node.policy.greedy)."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from swarm_node.config import GenerationConfig
from swarm_node.evaluation.evaluate import evaluate
from swarm_node.policy.greedy import ROUND_BATCHES
from swarm_node.policy.generation import HFGenerator
from swarm_node.policy.greedy import (
    MIN_SHARED_PREFIX,
    greedy_batch,
    left_pad,
    prefix_then_pad,
    shared_prefix_len,
    trim_completion,
)
from swarm_node.policy.models import Policy
from swarm_node.policy.types import GreedyCompletion
from swarm_node.tasks import Problem, PromptSet, render_prompt
from swarm_node.tasks.rewards import CorrectnessReward

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer() -> PreTrainedTokenizerFast:
    chars = sorted(set(string.printable) - set("\x0b\x0c"))
    specials = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
    tk = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(specials + chars)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<|im_end|>", unk_token="<unk>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML
    return tok


def prompt_set(n: int) -> PromptSet:
    return PromptSet(id="test-set", answer_kind="number",
                     problems=tuple(Problem(i, f"What is {i} plus {i}?", str(2 * i)) for i in range(n)))


def generator_of(model: Any, tok: PreTrainedTokenizerFast) -> HFGenerator:
    """The hf backend over `model` (its stop set: Policy.stop_token_ids, the tokenizer's eos here)."""
    policy = Policy(model=model, tokenizer=tok, device=torch.device("cpu"), dtype=torch.float32, model_id="test",
                    revision=None, fingerprint="", is_lora=False, local_path=Path("."))
    return HFGenerator(policy, GenerationConfig())


class ScriptedModel:
    """Stands in for a causal LM: `generate` appends a fixed completion per prompt (by prompt text)."""

    def __init__(self, tok: PreTrainedTokenizerFast, replies: dict[str, str], stop: dict[str, bool]) -> None:
        self.tok, self.replies, self.stop = tok, replies, stop
        self.training = True
        self.generation_config = type("G", (), {"eos_token_id": tok.eos_token_id})()
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def eval(self) -> None:
        self.training = False

    def train(self, mode: bool = True) -> None:
        self.training = mode

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any) -> torch.Tensor:
        config = kw["generation_config"]  # the node's own settings (policy.greedy.pinned_config)
        assert config.do_sample is False and config.repetition_penalty == 1.0
        self.seen.append((input_ids, attention_mask))
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
            prompt = self.tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
            question = next(q for q in self.replies if q in prompt)
            out = self.tok(self.replies[question], add_special_tokens=False)["input_ids"]
            out = out + ([self.tok.eos_token_id] if self.stop[question] else [])
            rows.append(out[: config.max_new_tokens])
        width = max(len(r) for r in rows)
        pad = self.tok.pad_token_id
        new = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, new], dim=1)


def test_helpers_pad_and_trim() -> None:
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert trim_completion([4, 5, 2, 0, 0], [2]) == ([4, 5, 2], True)
    assert trim_completion([4, 5, 6], [2]) == ([4, 5, 6], False)


@pytest.mark.parametrize("progress", [False, True])
def test_scripted_model_gives_exact_accuracy(progress: bool) -> None:
    tok = char_tokenizer()
    ps = prompt_set(5)
    replies = {p.question: f"{p.question} is \\boxed{{{p.answer if p.index % 2 == 0 else 99}}}" for p in ps.problems}
    stop = {p.question: p.index != 4 for p in ps.problems}
    model = ScriptedModel(tok, replies, stop)
    reward = CorrectnessReward("number", format_reward=0.5)
    out = evaluate(generator_of(model, tok), tok, ps, reward, limit=5, batch_size=2, max_new_tokens=64,
                   progress=progress)
    assert (out["n"], out["correct"]) == (5, 3) and out["accuracy"] == pytest.approx(0.6)
    assert [r["correct"] for r in out["records"]] == [True, False, True, False, True]
    assert [r["reward"] for r in out["records"]] == [1.5, 0.5, 1.5, 0.5, 1.5]  # the bonus never makes it correct
    assert out["records"][1]["completion"] == "What is 1 plus 1? is \\boxed{99}"  # no pad or eos text
    assert [r["stopped"] for r in out["records"]] == [True, True, True, True, False] and out["truncated"] == 1
    assert out["records"][0]["tokens"] == len(replies[ps.problems[0].question]) + 1  # eos counted
    assert out["generated_tokens"] == sum(r["tokens"] for r in out["records"])
    assert out["tokens_per_s"] > 0 and out["task"] == "test-set"
    assert model.training  # restored
    ids, mask = model.seen[0]  # left padding: real tokens flush right, exactly the rendered prompt
    for row in range(2):
        prompt = render_prompt(tok, ps.problems[row].question)
        assert ids[row, -len(prompt):].tolist() == prompt and mask[row].sum() == len(prompt)
        assert mask[row, -1] == 1
    assert len(model.seen) == 3  # batches of 2, 2, 1
    assert evaluate(generator_of(model, tok), tok, ps, reward, limit=2, batch_size=4, max_new_tokens=64,
                    progress=False)["n"] == 2


def mixed_lengths() -> PromptSet:
    """Short and long questions interleaved: 1, 1000, 2, 2000, ..."""
    problems = []
    for k in range(1, 4):
        for i, n in enumerate((k, 1000 * k)):
            problems.append(Problem(len(problems), f"What is {n} plus {n}?", str(2 * n)))
    return PromptSet(id="mixed", answer_kind="number", problems=tuple(problems))


def test_batches_hold_prompts_of_one_length_and_records_keep_the_sets_order() -> None:
    tok = char_tokenizer()
    ps = mixed_lengths()
    replies = {p.question: f"\\boxed{{{p.answer if p.index != 3 else 0}}}" for p in ps.problems}
    stop = {p.question: True for p in ps.problems}
    runs = {}
    for by_length in (True, False):
        model = ScriptedModel(tok, replies, stop)
        runs[by_length] = (evaluate(generator_of(model, tok), tok, ps, CorrectnessReward("number"), batch_size=3,
                                    max_new_tokens=64, progress=False, by_length=by_length), model.seen)
    (grouped, seen_grouped), (in_order, seen_in_order) = runs[True], runs[False]
    assert [r["index"] for r in grouped["records"]] == list(range(6))  # the set's order, whatever the batches
    assert [r["correct"] for r in grouped["records"]] == [True, True, True, False, True, True]
    assert grouped["records"] == in_order["records"]
    lengths = [sorted(set(mask.sum(1).tolist())) for _, mask in seen_grouped]
    assert [len(x) for x in lengths] == [1, 1] and lengths[0] < lengths[1]  # short ones, then long ones
    assert len(set(seen_in_order[0][1].sum(1).tolist())) == 2  # in the set's order a batch mixes both
    assert sum(ids.numel() for ids, _ in seen_grouped) < sum(ids.numel() for ids, _ in seen_in_order)  # less padding


@pytest.fixture
def one_thread() -> Any:
    """Tiny models run fastest single-threaded on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_llama(tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def test_tiny_llama_is_consistent_and_batch_invariant(one_thread: None) -> None:
    tok = char_tokenizer()
    gen = generator_of(tiny_llama(tok), tok)
    ps = prompt_set(5)
    reward = CorrectnessReward("number")
    a = evaluate(gen, tok, ps, reward, batch_size=3, max_new_tokens=6, progress=False)
    b = evaluate(gen, tok, ps, reward, batch_size=1, max_new_tokens=6, progress=False)
    assert a["n"] == 5 and 0 <= a["correct"] <= 5
    assert a["accuracy"] == pytest.approx(sum(r["correct"] for r in a["records"]) / 5)
    assert [reward.score(r["completion"], p).correct for r, p in zip(a["records"], ps.problems, strict=True)] == \
        [r["correct"] for r in a["records"]]
    assert all(1 <= r["tokens"] <= 6 for r in a["records"])
    assert [r["completion"] for r in a["records"]] == [r["completion"] for r in b["records"]]  # padding-invariant
    mixed = mixed_lengths()  # batches of one prompt length give the completions of batches in the set's order
    c = evaluate(gen, tok, mixed, reward, batch_size=4, max_new_tokens=6, progress=False)
    d = evaluate(gen, tok, mixed, reward, batch_size=4, max_new_tokens=6, progress=False, by_length=False)
    assert [r["completion"] for r in c["records"]] == [r["completion"] for r in d["records"]]


def test_shared_prefix_helpers() -> None:
    assert shared_prefix_len([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert shared_prefix_len([[1, 2, 3], [1, 2, 3]]) == 2  # each prompt keeps one token of its own
    assert shared_prefix_len([[7], [7]]) == 0 and shared_prefix_len([[1, 2], [3, 2]]) == 0
    ids, mask = prefix_then_pad([[1, 2, 3, 4], [1, 2, 5]], 2, pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 4], [1, 2, 0, 5]] and mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 1]]


def test_shared_prefix_decoding_matches_the_plain_batch(one_thread: None) -> None:
    """The worked example makes every prompt of a batch share a long prefix: computing it once gives
    the same greedy completions as the plain left-padded batch (and as one prompt at a time)."""
    tok = char_tokenizer()
    model = tiny_llama(tok)
    questions = ["What is 3 plus 4?", "What is 17 minus 9?", "Tom has 5 apples and eats 2. How many are left?"]
    prompts = [render_prompt(tok, q, worked_example=True) for q in questions]
    assert shared_prefix_len(prompts) >= MIN_SHARED_PREFIX  # so the shared path is the one taken
    stops, pad = [tok.eos_token_id], tok.pad_token_id

    def run(ps: list[list[int]], share: bool) -> list[tuple[list[int], str]]:
        out = greedy_batch(model, ps, 8, stop_ids=stops, pad_id=pad, device="cpu", share_prefix=share)
        return [(c.token_ids.tolist(), c.finish_reason) for c in out]

    shared, plain = run(prompts, True), run(prompts, False)
    alone = [run([p], True)[0] for p in prompts]
    assert shared == plain == alone
    assert all(len(c) >= 1 for c, _ in shared)
    # The generator's greedy (what evaluation calls) gives the same completions, in the prompts' order.
    through = generator_of(model, tok).greedy(prompts, 8, batch_size=2)
    assert [(c.token_ids.tolist(), c.finish_reason) for c in through] == shared


class ReplyGenerator:
    """A fake `Generator.greedy`: answers each prompt's question from a table; records its calls."""

    def __init__(self, tok: PreTrainedTokenizerFast, ps: PromptSet) -> None:
        self.tok = tok
        self.replies = {p.question: (f"\\boxed{{{p.answer if p.index % 3 else -1}}}", p.index % 4 != 1)
                        for p in ps.problems}
        self.calls: list[tuple[list[int], int, int]] = []

    def greedy(self, prompt_ids: list[list[int]], max_new_tokens: int, batch_size: int) -> list[GreedyCompletion]:
        self.calls.append(([len(p) for p in prompt_ids], max_new_tokens, batch_size))
        out = []
        for ids in prompt_ids:
            question = next(q for q in self.replies if q in self.tok.decode(ids))
            text, stops = self.replies[question]
            tokens = self.tok(text, add_special_tokens=False)["input_ids"] + ([self.tok.eos_token_id] if stops else [])
            out.append(GreedyCompletion(np.asarray(tokens, dtype=np.int64), "stop" if stops else "length"))
        return out


def test_evaluate_calls_the_generator_in_rounds_and_keeps_the_sets_order() -> None:
    tok = char_tokenizer()
    ps = prompt_set(21)  # questions of 1 and 2 digits: two prompt lengths
    gen = ReplyGenerator(tok, ps)
    out = evaluate(gen, tok, ps, CorrectnessReward("number"), batch_size=2, max_new_tokens=9, progress=False)
    assert [len(lengths) for lengths, _, _ in gen.calls] == [2 * ROUND_BATCHES, 21 - 2 * ROUND_BATCHES]
    assert all((new, b) == (9, 2) for _, new, b in gen.calls)
    sent = [n for lengths, _, _ in gen.calls for n in lengths]
    assert sent == sorted(sent)  # by length across calls
    assert [r["index"] for r in out["records"]] == list(range(21))
    assert [r["correct"] for r in out["records"]] == [i % 3 != 0 for i in range(21)]
    assert [r["stopped"] for r in out["records"]] == [i % 4 != 1 for i in range(21)]
    assert out["truncated"] == sum(i % 4 == 1 for i in range(21)) and out["correct"] == 14
    assert out["records"][2]["completion"] == "\\boxed{4}"  # the eos is not text
    assert out["records"][2]["tokens"] == len("\\boxed{4}") + 1
