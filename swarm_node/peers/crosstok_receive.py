"""Receiving a completion generated with another tokenizer: this node's tokens, chunks and logprobs.

A peer whose tokenizer fingerprint differs sends, per completion, its text (UTF-8, without special
tokens) and `piece_bytes`, the byte length of each of its tokens' pieces of the text's bytes (0 for
special tokens such as EOS). `receive_completion` tokenizes the text with this node's tokenizer
(no special tokens; this node's EOS appended when the completion finished with "stop"), checks the
round trip, aligns the two token streams (`swarm_node.method.crosstok.align`) and returns this node's
token ids, the chunk of each, and the generator's per-chunk logprobs laid out per own token
(`crosstok.last_token_shares`): what `TrainSample` carries for the objective. Pure given the
tokenizer: no I/O, no model.

A completion that cannot be used is dropped with a counted reason (peer data is untrusted):
  no_text          nothing to align: empty text and no end-of-sequence on both sides
  piece_bytes      the sender's piece_bytes do not match its tokens or its text's byte length
  text_roundtrip   this node's tokens do not reproduce the text (decode differs, e.g. a
                   tokenizer that normalises or lacks characters, or special tokens in the text),
                   or their byte lengths do not add up to the text's
  text_too_long    more own tokens than the caller allows
A group is used whole or not at all (`receive_group`): a dropped completion would bias its group's
advantages. The work done is this node's tokenization of the text: `own_tokens` counts it, for the
per-step peer budgets. A receiver converts a group first (cheap, and it may drop the group), then
computes the rewards from the completions' texts, then makes the samples (`train_samples`).

Text bound to tokens. The receiver trains on the text, while a spot-check can only test the tokens
and logprobs: a sender could send tokens that decode to "x = 7" with the text "x = 42". Where this
node holds the sender's tokenizer (`held_tokenizer`: a spot-check reference of the group's
fingerprint, `swarm.spot_check.reference_models`), it checks first that every completion's text is
what that tokenizer makes of its tokens (`text_matches_tokens`: the decoding without special
tokens, and for a byte-level tokenizer each token's byte count), and a group where one is not is
dropped as `text_token_mismatch`, a fault of its sender. Where it does not hold it, nothing binds
the text to the tokens: a lying text is trained on like any other, within the bound of every peer
sample (docs/method.md, "What a hostile peer can do": weights at most C, the KL filter, fair
sampling).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from swarm_node.method.crosstok import AlignmentError, align, chunk_logprobs, last_token_shares
from swarm_node.policy.pieces import piece_table
from swarm_node.policy.types import TrainSample

DROP_NO_TEXT = "no_text"
DROP_PIECE_BYTES = "piece_bytes"
DROP_TEXT_ROUNDTRIP = "text_roundtrip"
DROP_TEXT_TOO_LONG = "text_too_long"
DROP_TEXT_TOKEN_MISMATCH = "text_token_mismatch"  # a text its sender's tokenizer does not make of its tokens


class ForeignCompletion(Protocol):
    """What the receiver reads of a wire completion (`protocol.messages.Completion`, frozen)."""

    @property
    def text(self) -> str: ...

    @property
    def piece_bytes(self) -> np.ndarray: ...  # uint16 [T]

    @property
    def logprobs(self) -> np.ndarray: ...  # float32 [T]

    @property
    def finish_reason(self) -> str: ...


class TokenizerHolder(Protocol):
    """A tokenizer this node holds and the fingerprint it has (`spotcheck.Reference`)."""

    @property
    def tokenizer(self) -> Any: ...

    @property
    def fingerprint(self) -> str: ...


def held_tokenizer(holders: Iterable[TokenizerHolder], fingerprint: str) -> Any | None:
    """The tokenizer of `fingerprint` among `holders`, None when this node holds none."""
    return next((h.tokenizer for h in holders if h.fingerprint == fingerprint), None)


def text_matches_tokens(tokenizer: Any, token_ids: Sequence[int] | np.ndarray, text: str,
                        piece_bytes: Sequence[int] | np.ndarray) -> bool:
    """Whether `text` is what `tokenizer` (the sender's) makes of `token_ids`: their decoding without
    special tokens (what an honest sender sends: `policy.pieces.completion_text`), and for a
    byte-level tokenizer `piece_bytes` each token's raw byte count (0 for special tokens). A token id
    beyond the tokenizer's vocabulary matches nothing. O(tokens)."""
    ids = [int(i) for i in token_ids]
    if any(not 0 <= i < len(tokenizer) for i in ids):
        return False
    if tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) != text:
        return False
    table = piece_table(tokenizer)
    if table.raw is None:  # pieces from decoded prefixes: O(tokens^2), not checked here
        return True
    if any(i >= len(table.raw) and i not in table.special for i in ids):
        return False
    pieces = [0 if i in table.special else len(table.raw[i]) for i in ids]
    return pieces == [int(n) for n in piece_bytes]


def texts_match_tokens(tokenizer: Any, completions: Sequence[Any]) -> bool:
    """`text_matches_tokens` for every completion of a group (wire `Completion`s)."""
    return all(text_matches_tokens(tokenizer, c.token_ids, c.text, c.piece_bytes) for c in completions)


@dataclass(frozen=True)
class OwnView:
    """A foreign completion in this node's tokens.

    completion_ids:     int64 [T_own], this node's tokens of the text (+ its EOS after "stop")
    chunk_ids:          int64 [T_own], the aligned chunk of each (nondecreasing from 0)
    generator_logprobs: float32 [T_own], log pi_gen(chunk) on each chunk's last own token, 0 elsewhere
    n_chunks:           number of chunks
    """

    completion_ids: np.ndarray
    chunk_ids: np.ndarray
    generator_logprobs: np.ndarray
    n_chunks: int

    @property
    def own_tokens(self) -> int:
        return len(self.completion_ids)


@dataclass(frozen=True)
class Received:
    """The outcome of `receive_completion`: a view, or the reason it was dropped; `own_tokens` is
    the number of tokens this node's tokenizer produced either way (the work it cost)."""

    view: OwnView | None
    reason: str | None
    own_tokens: int


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"


def own_piece_bytes(tokenizer: Any, token_ids: Sequence[int], text: str) -> np.ndarray | None:
    """int64 [T]: the byte length of each token's piece of `text.encode("utf-8")` (special tokens 0),
    or None when the tokens' pieces do not add up to the text.

    Byte-level BPE: each character of a regular token string stands for one byte (the ByteLevel
    alphabet), so a token holding part of a UTF-8 character gets exactly its bytes; added tokens
    count their content's bytes. Other tokenizers: from decoding growing prefixes; a token whose
    prefix does not decode to a prefix of the text (part of a character, a marker realised by the
    next token) gets 0 bytes and the next token that completes a prefix gets them."""
    ids = [int(i) for i in token_ids]
    data = text.encode("utf-8")
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    if _is_byte_level(tokenizer):
        added = {int(i): tok for tok, i in tokenizer.get_added_vocab().items()}
        pieces = tokenizer.convert_ids_to_tokens(ids)
        lengths = [0 if i in specials else len(added[i].encode("utf-8")) if i in added else len(str(p))
                   for i, p in zip(ids, pieces, strict=True)]
    else:
        lengths, done = [], 0
        for k in range(1, len(ids) + 1):
            prefix = tokenizer.decode(ids[:k], skip_special_tokens=True,
                                      clean_up_tokenization_spaces=False).encode("utf-8")
            end = len(prefix) if data.startswith(prefix) and len(prefix) >= done else done
            lengths.append(end - done)
            done = end
    out = np.asarray(lengths, dtype=np.int64)
    return out if int(out.sum()) == len(data) else None


def receive_completion(tokenizer: Any, eos_token_id: int, completion: ForeignCompletion,
                       max_own_tokens: int | None = None) -> Received:
    """This node's view of a foreign completion, or the reason to drop it (module doc)."""
    text, finish = completion.text, completion.finish_reason
    logprobs = np.asarray(completion.logprobs, dtype=np.float32).reshape(-1)
    sender_bytes = np.asarray(completion.piece_bytes, dtype=np.int64).reshape(-1)
    try:
        data = text.encode("utf-8")
    except (AttributeError, UnicodeEncodeError):  # not a str, or lone surrogates: not UTF-8 text
        return Received(None, DROP_TEXT_ROUNDTRIP, 0)
    if len(sender_bytes) != len(logprobs) or int(sender_bytes.sum()) != len(data):
        return Received(None, DROP_PIECE_BYTES, 0)
    if not text and finish != "stop":
        return Received(None, DROP_NO_TEXT, 0)
    ids = list(tokenizer.encode(text, add_special_tokens=False)) if text else []
    own_tokens = len(ids) + int(finish == "stop")
    if max_own_tokens is not None and own_tokens > max_own_tokens:
        return Received(None, DROP_TEXT_TOO_LONG, own_tokens)
    decoded = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    own_bytes = own_piece_bytes(tokenizer, ids, text) if decoded == text else None
    if own_bytes is None:
        return Received(None, DROP_TEXT_ROUNDTRIP, own_tokens)
    if finish == "stop":
        ids.append(int(eos_token_id))
        own_bytes = np.append(own_bytes, 0)
    try:
        alignment = align(sender_bytes, own_bytes)
    except AlignmentError:
        return Received(None, DROP_NO_TEXT, own_tokens)
    per_chunk = chunk_logprobs(logprobs, alignment.chunks_a, alignment.n_chunks)  # float64 [C]
    view = OwnView(
        completion_ids=np.asarray(ids, dtype=np.int64), chunk_ids=alignment.chunks_b,
        generator_logprobs=last_token_shares(per_chunk, alignment.chunks_b).astype(np.float32),
        n_chunks=alignment.n_chunks)
    return Received(view, None, own_tokens)


@dataclass(frozen=True)
class ReceivedGroup:
    """A foreign group in this node's tokens (every completion's view, in order), or none with the
    first reason one failed. `own_tokens`: tokens this node's tokenizer produced for it (its cost)."""

    views: list[OwnView]
    reason: str | None
    own_tokens: int


def receive_group(tokenizer: Any, eos_token_id: int, completions: Sequence[ForeignCompletion],
                  max_own_tokens: int | None = None) -> ReceivedGroup:
    """Every completion of a foreign group in this node's tokens, or none with the reason of the
    first unusable one (module doc). Cheaper than verifying the group's answers: run it first."""
    views, spent = [], 0
    for completion in completions:
        got = receive_completion(tokenizer, eos_token_id, completion, max_own_tokens)
        spent += got.own_tokens
        if got.view is None:
            return ReceivedGroup([], got.reason, spent)
        views.append(got.view)
    return ReceivedGroup(views, None, spent)


def train_samples(views: Sequence[OwnView], rewards: Sequence[float], *, prompt_ids: np.ndarray, group_key: str,
                  source: str, record_id: str = "") -> list[TrainSample]:
    """Peer training samples of a received group: this node's prompt ids (its own template), the
    views' tokens, chunk ids and generator logprob shares, and the rewards this node computed from
    the completions' texts (which the views reproduce exactly)."""
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    return [TrainSample(group_key=group_key, prompt_ids=prompt, completion_ids=v.completion_ids,
                        generator_logprobs=v.generator_logprobs, reward=float(r), is_peer=True, source=source,
                        record_id=record_id, chunk_ids=v.chunk_ids)
            for v, r in zip(views, rewards, strict=True)]
