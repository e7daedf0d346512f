"""A completion's exact text and the bytes each of its tokens contributes to it (the sender's half of
cross-tokenizer exchange: `protocol.messages.Completion.text` / `piece_bytes`).

Decoding tokens one by one is wrong for byte-level BPE (GPT-2 style: SmolLM2, Qwen2.5, Llama 3, the
tiny test tokenizers): a token may hold part of a multi-byte UTF-8 character, and on its own it
decodes to U+FFFD. So for a byte-level tokenizer every token's raw bytes come from its vocabulary
entry (the byte-level alphabet maps each of 256 printable characters back to one byte); the text
is the UTF-8 decoding of all raw bytes joined, and `piece_bytes[t] = len(raw[t])`, so
b"".join(raw) == text.encode("utf-8") by construction. Special tokens (eos etc.) have no bytes.
Other tokenizers (SentencePiece with byte fallback, ...) fall back to decoding growing prefixes:
token t's piece is what it adds to the decoded prefix, and a trailing U+FFFD (a character not yet
complete) waits for the token that completes it.

`completion_text` returns None when no faithful text exists: the tokens' bytes are not valid
UTF-8 (a character cut by the token cap, or stray byte tokens), the text breaks the receivers'
rules (`protocol.validate.text_reasons`: forbidden characters, too long), or the tokenizer's
decoding is not prefix-consistent. The sender then sends the completion's longest prefix that has
faithful text (`faithful_prefix`: a completion cut mid-character loses its partial character's
tokens, one with a stray byte or forbidden character is cut before it), and leaves text off the
whole group only when some completion has no such prefix.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol.validate import ValidationLimits, first_forbidden_char, text_reasons

_TEXT_LIMITS = ValidationLimits(vocab_size=1)  # the default text rules every receiver applies


def byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: character -> the byte it stands for. Printable Latin-1 bytes
    stand for themselves; the other 68 bytes (controls, space, a few Latin-1 ones) are shifted, in
    byte order, to the characters from U+0100 on."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    shifted = [b for b in range(256) if b not in set(printable)]
    table.update({chr(0x100 + k): b for k, b in enumerate(shifted)})
    return table


@dataclass(frozen=True)
class PieceTable:
    """Per token id of one tokenizer: its raw bytes (b"" for special tokens), or None for every id
    when the tokenizer is not byte-level (`completion_text` then decodes prefixes)."""

    raw: tuple[bytes, ...] | None
    special: frozenset[int]


_TABLES: weakref.WeakKeyDictionary[Any, PieceTable] = weakref.WeakKeyDictionary()


def piece_table(tokenizer: Any) -> PieceTable:
    """The (cached) table of `tokenizer`: built once from its vocabulary, O(vocabulary)."""
    table = _TABLES.get(tokenizer)
    if table is None:
        table = _TABLES[tokenizer] = _build_table(tokenizer)
    return table


def _build_table(tokenizer: Any) -> PieceTable:
    added = dict(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    special = {int(i) for i, tok in added.items() if getattr(tok, "special", False)}
    special |= {int(i) for i in getattr(tokenizer, "all_special_ids", [])}
    if not _is_byte_level(tokenizer):
        return PieceTable(raw=None, special=frozenset(special))
    alphabet = byte_level_alphabet()
    vocab = tokenizer.get_vocab()
    raw: list[bytes] = [b""] * (max(vocab.values(), default=-1) + 1)
    for token, i in vocab.items():
        if i in special:
            continue
        if i in added:  # a non-special added token decodes to its content as written
            raw[i] = str(added[i].content).encode("utf-8")
        elif all(ch in alphabet for ch in token):
            raw[i] = bytes(alphabet[ch] for ch in token)
        else:
            return PieceTable(raw=None, special=frozenset(special))
    return PieceTable(raw=tuple(raw), special=frozenset(special))


def _is_byte_level(tokenizer: Any) -> bool:
    """Whether the fast tokenizer's decoder is exactly the byte-level one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    return decoder.get("type") == "ByteLevel"


def completion_text(tokenizer: Any, token_ids: Sequence[int] | np.ndarray) -> tuple[str, np.ndarray] | None:
    """(text, piece_bytes uint16 [T]) of a completion, or None when it has no faithful text."""
    ids = [int(i) for i in token_ids]
    table = piece_table(tokenizer)
    if table.raw is not None:
        if any(i >= len(table.raw) for i in ids if i not in table.special):
            return None
        raws = [b"" if i in table.special else table.raw[i] for i in ids]
        try:
            text = b"".join(raws).decode("utf-8")
        except UnicodeDecodeError:
            return None  # a character cut in two (the token cap) or stray bytes: no exact text
        lengths = [len(r) for r in raws]
        if text != _decode(tokenizer, ids):  # the table disagrees with the tokenizer: trust neither
            return None
    else:
        decoded = pieces_by_prefix(tokenizer, ids, table.special)
        if decoded is None:
            return None
        text, lengths = decoded
    if max(lengths, default=0) > 0xFFFF:
        return None
    pieces = np.array(lengths, dtype=np.uint16)
    if text_reasons(text, pieces, len(ids), _TEXT_LIMITS):
        return None  # receivers would drop the whole group for it
    return text, pieces


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def pieces_by_prefix(tokenizer: Any, ids: list[int], special: frozenset[int]) -> tuple[str, list[int]] | None:
    """Pieces from decoding growing prefixes (O(T^2) characters; for tokenizers that are not
    byte-level). None when a prefix's text is not a prefix of the next one's."""
    lengths, stable = [], ""
    for t in range(len(ids)):
        if ids[t] in special:
            lengths.append(0)
            continue
        text = _decode(tokenizer, ids[: t + 1])
        if not text.startswith(stable):
            return None
        grown = text.rstrip("\ufffd")  # an incomplete character counts when it completes
        lengths.append(len(grown.encode("utf-8")) - len(stable.encode("utf-8")))
        stable = grown
    text = _decode(tokenizer, ids)
    if text != stable or sum(lengths) != len(text.encode("utf-8")):
        return None  # ends inside a character (or a decoder that rewrites earlier text)
    return text, lengths


MAX_TRIM_TOKENS = 4  # faithful_prefix: tokens tried off the end (a UTF-8 character is at most 4 bytes)


def faithful_prefix(tokenizer: Any, token_ids: Sequence[int] | np.ndarray) -> tuple[int, str, np.ndarray] | None:
    """(k, text, piece_bytes) of a prefix token_ids[:k], k >= 1, that has faithful text
    (`completion_text`): the longest of the candidates below that has one, or None. For a completion cut
    mid-character by the token cap (or holding a stray byte or a forbidden character), the sender
    sends this prefix instead of the whole completion, so one cut completion does not leave its
    group without text. The candidates are the whole completion, then, for a byte-level tokenizer,
    the tokens whose bytes end before the first undecodable byte or forbidden character, then up
    to MAX_TRIM_TOKENS tokens off the end (a character is at most 4 bytes)."""
    ids = [int(i) for i in token_ids]
    tried: set[int] = set()
    for k in _prefix_candidates(tokenizer, ids):
        if k < 1 or k in tried:
            continue
        tried.add(k)
        found = completion_text(tokenizer, ids[:k])
        if found is not None:
            return k, found[0], found[1]
    return None


def _prefix_candidates(tokenizer: Any, ids: list[int]) -> list[int]:
    candidates = [len(ids)]
    table = piece_table(tokenizer)
    if table.raw is not None and all(i < len(table.raw) for i in ids if i not in table.special):
        raws = [b"" if i in table.special else table.raw[i] for i in ids]
        good = _good_bytes(b"".join(raws))
        k, total = 0, 0
        while k < len(raws) and total + len(raws[k]) <= good:
            total += len(raws[k])
            k += 1
        candidates += [k - j for j in range(MAX_TRIM_TOKENS + 1)]
    candidates += [len(ids) - j for j in range(1, MAX_TRIM_TOKENS + 1)]
    return candidates


def _good_bytes(data: bytes) -> int:
    """Bytes of `data` before its first undecodable byte or forbidden character."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        text = data[: e.start].decode("utf-8")
    bad = first_forbidden_char(text)
    return len(text[:bad].encode("utf-8"))
