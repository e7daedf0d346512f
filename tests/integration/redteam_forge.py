"""The red-team attacker's groups and records against nodes that learn (used by redteam_attacker.py,
under the same rules: the wire format and the DHT only, nothing of the node's code).

* Learnable groups: G - 1 correct answers and one wrong one on a prompt the binding assigns the
  sender, so the group has non-zero advantages (a group whose answers all earn the same reward has
  advantage 0 and no influence whatever its logprobs); their logprobs are forged (`logprob`).
* Foreign-tokenizer groups: the same answers sent as another tokenizer's text (a fingerprint no
  honest node has, one token per byte of text, then an end-of-sequence token of 0 bytes), either
  consistent (`valid`) or broken in one way: pieces that disagree with the text, invalid UTF-8,
  text longer than the per-token cap.
* A Sybil index flood: many identities, each storing one small well-formed index record under the
  same index key (a window's level-0 key), listing one entry on a prompt assigned to it (stamped at
  the attack's time, so in the next windows' keys the entry is also an index_mismatch).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from protocol import codec, keys
from protocol.messages import Completion, IndexEntry, PromptRef, RolloutGroup, RolloutIndex, SamplingParams

FOREIGN_FINGERPRINT = "redteam-foreign-tokenizer-v1"
FOREIGN_KINDS = ("pieces_mismatch", "invalid_utf8", "too_long")  # each one drop reason (see the test)
MAX_TEXT_BYTES_PER_TOKEN = 32  # the public cap (protocol/validate.py); "too_long" goes past it


def _wire_group(ident: Any, ctx: dict, version: int, index: int, comps: tuple, fingerprint: str,
                model: tuple[str, str] = ("tiny", "")) -> RolloutGroup:
    return RolloutGroup(
        swarm_id=ctx["swarm"], sender=ident.peer_id, model_id=model[0], model_revision=model[1],
        tokenizer_fingerprint=fingerprint, policy_version=version, created_at=ctx["now"],
        prompt=PromptRef(prompt_set_id=ctx["prompt_set_id"], index=index, sha256=ctx["shas"][index]),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=ctx["max_new_tokens"]),
        completions=comps)


def _answers(ctx: dict, index: int) -> list[bool]:
    """Which completions of a learnable group are correct: all but the last."""
    return [k < ctx["group_size"] - 1 for k in range(ctx["group_size"])]


def learnable_group(ident: Any, ctx: dict, version: int, index: int, logprob: float,
                    model: tuple[str, str] = ("tiny", "")) -> RolloutGroup:
    """A valid group in the receiver's tokenizer: correct answers and one wrong one, every token's
    logprob set to `logprob`, declaring `model` (id, revision): a model no node holds by default,
    or the public warm model the honest nodes hold as a spot-check reference."""
    right, wrong = ctx["answer_tokens"][str(index)]
    comps = tuple(Completion(token_ids=np.asarray(t, np.uint32), logprobs=np.full(len(t), logprob, np.float32),
                             finish_reason="stop", claimed_reward=1.0)
                  for t in (right if ok else wrong for ok in _answers(ctx, index)))
    return _wire_group(ident, ctx, version, index, comps, ctx["fingerprint"], model)


def _foreign_completion(text: str, kind: str, logprob: float) -> Completion:
    data = text.encode("utf-8", "surrogateescape")
    if kind == "too_long":  # trailing spaces until the text is over the per-token cap
        n_tokens = len(data) + 1
        data += b" " * (MAX_TEXT_BYTES_PER_TOKEN * n_tokens + 1 - len(data))
        pieces = [len(data) // (n_tokens - 1)] * (n_tokens - 1)
        pieces[-1] += len(data) - sum(pieces)
    else:
        if kind == "invalid_utf8":
            data += b"\xff"  # a byte no UTF-8 text holds (the decoder keeps it as a lone surrogate)
        pieces = [1] * len(data)
    if kind == "pieces_mismatch":
        pieces[0] += 1  # one byte more than the text has
    ids = [3 + b for b in data[: len(pieces)]] + [0]  # one token per piece, then the end-of-sequence token
    pieces = pieces + [0]
    return Completion(token_ids=np.asarray(ids, np.uint32), logprobs=np.full(len(ids), logprob, np.float32),
                      finish_reason="stop", claimed_reward=1.0, text=data.decode("utf-8", "surrogateescape"),
                      piece_bytes=np.asarray(pieces, np.uint16))


def foreign_group(ident: Any, ctx: dict, version: int, index: int, kind: str, logprob: float = -1.0) -> RolloutGroup:
    """The learnable answers as another tokenizer's text; `kind` "valid" or one of FOREIGN_KINDS."""
    right, wrong = ctx["answer_texts"][str(index)]
    comps = tuple(_foreign_completion(right if ok else wrong, kind, logprob) for ok in _answers(ctx, index))
    return _wire_group(ident, ctx, version, index, comps, FOREIGN_FINGERPRINT)


def small_index(ident: Any, ctx: dict, window: int, index: int) -> bytes:
    """A well-formed one-entry index record of `ident` for `window` (its chunk stored by nobody)."""
    digest = hashlib.sha256(f"{ident.peer_id}:{window}".encode()).hexdigest()
    entry = IndexEntry(chunk_digests=(digest,), size=600, prompt_index=index, policy_version=1000,
                       created_at=ctx["now"])
    return codec.encode(RolloutIndex(sender=ident.peer_id, window=window, entries=(entry,)))


def sybil_index_items(att: Any, idents: list, ctx: dict, windows: range) -> list[tuple]:
    """Each identity's small index record under each window's level-0 index key."""
    exp = ctx["now"] + 60
    return [att.owned(i, keys.rollout_index_key(ctx["swarm"], w), small_index(i, ctx, w, att.assigned(i, ctx, w)[0]),
                      exp) for w in windows for i in idents]
