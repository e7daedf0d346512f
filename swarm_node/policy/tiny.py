"""Tiny random Llama-style models and byte-level tokenizers, built in code (no hub), for tests.

A spec `tiny-random:<hidden>x<layers>[-tied][-g<n>][-v<vocab>][:<variant>[:<seed>]]` names one model exactly
(`-tied`: the output head shares the input embedding matrix, as in SmolLM2; `-g<n>`: n query heads share
each key/value head, as Qwen2.5's 6 to 7 do (default: 2 when the head count is even, else none shared);
`-v<vocab>`: the model's
vocabulary is padded to `vocab` rows, as a real model's is larger than these tokenizers, for memory and
speed checks at realistic logit sizes; ids past the tokenizer's decode to nothing): the same
spec always gives the same weights and the same tokenizer, so two test nodes naming the same spec
hold the same model. Tokenizer variants have different vocabularies (hence different
fingerprints), so tests can pair nodes with matching and non-matching tokenizers:

    a: 3 special tokens (ids 0-2), then the 256 byte-level tokens                (259 tokens)
    b: the 256 byte-level tokens, 100 merged digit pairs "00".."99", then specials (359 tokens)
    c: a byte-level BPE *trained* (in ~0.1 s, deterministically) on generated arithmetic text:
       specials (ids 0-2), the 256 bytes, then learnt merges such as "Ġ345", "Ġanswer"
       (TRAINED_VOCAB_SIZE tokens): token boundaries unlike a, b or SmolLM2's, for cross-tokenizer
       tests (`swarm_node.method.crosstok`)

Both have a ChatML-like chat template and `<|im_end|>` as the eos token. Head dim is 32 (vLLM
needs >= 32), so hidden must be a multiple of 32. Random init gives a near-uniform next-token
distribution, under which eos would almost never be sampled; `build_tiny_model` points the eos
output row along the model's mean final hidden state and scales it (by bisection on random
inputs) so that eos has probability about EOS_PROBABILITY at a typical position, whatever the
model's size: sampled completions stop after a few dozen tokens on average and tests see both
finish reasons.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PREFIX = "tiny-random:"
HEAD_DIM = 32
SPECIALS = ("<|pad|>", "<|im_start|>", "<|im_end|>")
VARIANTS = ("a", "b", "c")
TRAINED_VOCAB_SIZE = 512
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SPEC_RE = re.compile(r"^tiny-random:(\d+)x(\d+)(-tied)?(?:-g(\d+))?(?:-v(\d+))?(?::([a-z]))?(?::(\d+))?$")
EOS_PROBABILITY = 1 / 25  # mean eos probability per position: completions stop after ~25 tokens on average


@dataclass(frozen=True)
class TinySpec:
    hidden: int
    layers: int
    variant: str = "a"
    seed: int = 0
    tied: bool = False
    vocab: int = 0  # model vocabulary rows; 0: the tokenizer's size
    kv_group: int = 0  # query heads per key/value head; 0: the default (2 when the head count is even, else 1)

    @property
    def heads(self) -> int:
        return self.hidden // HEAD_DIM

    @property
    def kv_heads(self) -> int:
        if self.kv_group:
            return self.heads // self.kv_group
        return max(1, self.heads // 2) if self.heads % 2 == 0 else self.heads

    @property
    def dir_name(self) -> str:
        """A file-system-safe name; bump the suffix when the construction below changes."""
        padded = f"-v{self.vocab}" if self.vocab else ""
        group = f"-g{self.kv_group}" if self.kv_group else ""
        return (f"tiny-{self.hidden}x{self.layers}{'-tied' if self.tied else ''}{group}{padded}-{self.variant}"
                f"-s{self.seed}-v2")


def is_tiny_spec(name: str) -> bool:
    return name.startswith(PREFIX)


def parse_tiny_spec(name: str) -> TinySpec:
    """Parse `tiny-random:<hidden>x<layers>[-tied][-g<n>][-v<vocab>][:<variant>[:<seed>]]`; raises ValueError if
    malformed."""
    m = _SPEC_RE.match(name)
    if m is None:
        raise ValueError(f"bad tiny model spec {name!r}: "
                         "expected tiny-random:<hidden>x<layers>[-tied][-g<n>][-v<vocab>][:<a|b|c>[:<seed>]]")
    hidden, layers = int(m.group(1)), int(m.group(2))
    tied, group, vocab = m.group(3) is not None, int(m.group(4) or 0), int(m.group(5) or 0)
    variant, seed = m.group(6) or "a", int(m.group(7) or 0)
    if hidden < HEAD_DIM or hidden % HEAD_DIM or hidden > 4096:
        raise ValueError(f"tiny model hidden size must be a multiple of {HEAD_DIM} in [32, 4096], got {hidden}")
    if not 1 <= layers <= 64:
        raise ValueError(f"tiny model layers must be in [1, 64], got {layers}")
    if variant not in VARIANTS:
        raise ValueError(f"tiny tokenizer variant must be one of {VARIANTS}, got {variant!r}")
    if vocab > 262144:
        raise ValueError(f"tiny model vocabulary must be at most 262144, got {vocab}")
    if m.group(4) is not None and (group < 1 or (hidden // HEAD_DIM) % group):
        raise ValueError(f"tiny model -g{group}: the {hidden // HEAD_DIM} heads of hidden {hidden} must split into "
                         f"groups of {group} (hidden = {HEAD_DIM} x heads)")
    return TinySpec(hidden, layers, variant, seed, tied, vocab, group)


def _arithmetic_corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Generated arithmetic questions and answers (fixed seed: the same text on every machine)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b, op = rng.randint(0, 999), rng.randint(0, 999), rng.choice("+-*")
        r = a + b if op == "+" else a - b if op == "-" else a * b
        lines.append(f"What is {a} {op} {b}? The answer is {r}. So {a} {op} {b} = {r}.\n\\boxed{{{r}}}")
    return lines


def _trained_tokenizer() -> Tokenizer:
    """Variant c: byte-level BPE trained on `_arithmetic_corpus` (deterministic: fixed text, and
    the trainer breaks ties between equally frequent pairs by the pair itself)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=TRAINED_VOCAB_SIZE, min_frequency=2, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_arithmetic_corpus(), trainer=trainer)
    return tok


def build_tiny_tokenizer(variant: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any text encodes; decode(encode(s)) == s) built in code."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 printable stand-ins for bytes
    merges: list[tuple[str, str]] = []
    if variant == "c":
        tok = _trained_tokenizer()
    elif variant == "a":
        vocab = {tok: i for i, tok in enumerate([*SPECIALS, *alphabet])}
    elif variant == "b":
        pairs = [f"{x}{y}" for x in "0123456789" for y in "0123456789"]
        merges = [(p[0], p[1]) for p in pairs]
        vocab = {tok: i for i, tok in enumerate([*alphabet, *pairs, *SPECIALS])}
    else:
        raise ValueError(f"unknown tiny tokenizer variant {variant!r}")
    if variant != "c":
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|im_end|>", bos_token="<|im_start|>",
        model_max_length=4096,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def _calibrate_eos(model: LlamaForCausalLM, probe: torch.Tensor, eos_id: int) -> None:
    """Set the eos output row to a * u (u: unit mean final hidden state on `probe`) with `a` chosen
    by bisection so that the mean eos probability over the probe's positions is EOS_PROBABILITY."""
    with torch.no_grad():
        hidden = model.model(probe).last_hidden_state  # [4, 24, H]
        u = hidden.mean(dim=(0, 1))
        u /= u.norm()
        head = model.get_output_embeddings().weight  # [V, H]
        head[eos_id] = 0.0
        others = torch.logsumexp(model.lm_head(hidden), dim=-1)  # [4, 24], eos logit 0 included
        proj = hidden @ u  # [4, 24], mostly positive: u is the mean direction
        lo, hi = 0.0, 64.0
        for _ in range(40):
            a = (lo + hi) / 2
            p_eos = torch.sigmoid(a * proj - others).mean()  # eos vs the rest, eos taken out approx.
            lo, hi = (a, hi) if p_eos < EOS_PROBABILITY else (lo, a)
        head[eos_id] = lo * u


def build_tiny_model(spec: TinySpec, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A randomly initialised float32 Llama, deterministic in `spec` (forks the torch RNG)."""
    config = LlamaConfig(
        vocab_size=max(len(tokenizer), spec.vocab),
        hidden_size=spec.hidden,
        intermediate_size=2 * spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=HEAD_DIM,
        max_position_embeddings=4096,
        tie_word_embeddings=spec.tied,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.05,
        architectures=["LlamaForCausalLM"],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1_000_003 * spec.seed + 7919 * spec.hidden + spec.layers)
        model = LlamaForCausalLM(config)
        probe = torch.randint(len(SPECIALS), len(tokenizer), (4, 24))  # [4, 24] random token ids
        _calibrate_eos(model, probe, tokenizer.eos_token_id)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval()
