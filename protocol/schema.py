"""Field order and type checks of each message body (the msgpack array inside the codec's frame),
within the hard caps of `limits.Limits`.

`to_wire` turns a message into msgpack-ready lists, checking types and limits so we never write
what a peer would refuse; `from_wire` does the reverse on an unpacked body, checking every type,
length and count and raising ProtocolError with the field path. The protocol version travels in
the frame header, not in the body.

Bodies (version 2; version 1 differs where noted):
    RolloutGroup      [swarm_id, sender, model_id, model_revision, adapter_digest, tokenizer_fingerprint,
                       policy_version, created_at, [prompt_set_id, index, sha256],
                       [temperature, top_p, max_new_tokens],
                       [[n_tokens, n_logprobs, finish_reason, claimed_reward], ...],
                       token_bytes (<u4, all completions), logprob_bytes (<f4, all completions)]
                      and, only when some completion carries text (never in version 1), each
                      completion head gains [..., n_text_bytes, n_pieces] and the body two fields:
                       text_bytes (UTF-8, all completions' texts concatenated),
                       piece_bytes (<u2, all completions' piece lengths concatenated)
                      Version 1: without adapter_digest and never with text (12 fields).
    RolloutIndex      [sender, window, [[[digest, ...], size, prompt_index, policy_version, created_at,
                                        tokenizer_fingerprint, has_text, group_size], ...]]
                      (versions 1-3: entries of the first 5 fields only)
    NodeStatus        [peer_id, role, model_id, step, timestamp, [maddr, ...], {metric: value},
                       tokenizer_fingerprint, receipts_span_s,
                       [[sender, taken, samples, gradient, filtered, filtered_advantage, filtered_kl,
                         [[reason, groups], ...]], ...]]
                      (version 2: without the receipts' two fields; version 1: also without
                       tokenizer_fingerprint)
    PromptSetManifest [prompt_set_id, name, answer_kind, num_problems, [digest, ...],
                       owner_public_key, created_at, signature]
    PromptChunk       [[[index, question, answer], ...]]
    PromptSetTombstone [prompt_set_id, owner_public_key, ended_at, successor, signature]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocol.fields import bool_field as _bool
from protocol.fields import bytes_field as _bytes
from protocol.fields import digests_field as _digests
from protocol.fields import float_field as _float
from protocol.fields import int_field as _int
from protocol.fields import seq_field as _seq
from protocol.fields import str_field as _str
from protocol.limits import Limits
from protocol.messages import (
    Completion,
    IndexEntry,
    Message,
    NodeStatus,
    PromptChunk,
    PromptRef,
    PromptSetManifest,
    PromptSetTombstone,
    ProtocolError,
    Receipt,
    RolloutGroup,
    RolloutIndex,
    SamplingParams,
)

def shuffle_bytes(buf: bytes, width: int = 4) -> bytes:
    """Byte-transpose `buf` of width-byte items: all first bytes, then all second bytes, ..."""
    return np.frombuffer(buf, np.uint8).reshape(-1, width).T.tobytes()


def unshuffle(buf: bytes, dtype: str, width: int = 4) -> np.ndarray:
    planes = np.frombuffer(buf, np.uint8).reshape(width, -1)
    return planes.T.copy().view(dtype).reshape(-1)


GROUP_FIELDS_V1 = 12  # a version-1 group body (no adapter digest, no text)
GROUP_FIELDS = 13  # a version-2 group body without text
GROUP_FIELDS_WITH_TEXT = 15
TAIL_WIDTHS = {GROUP_FIELDS_V1: (4, 4), GROUP_FIELDS: (4, 4), GROUP_FIELDS_WITH_TEXT: (4, 4, 1, 2)}
"""Item widths of the byte strings that end a group body of each length (tokens, logprobs[, text,
pieces]): the codec ends a zstd block at each byte plane of them (width 1: one plane)."""


def _text_bytes(text: str) -> bytes:
    """UTF-8 of a completion's text; lone surrogates U+DC80-U+DCFF stand for the undecodable bytes
    of a received text (see messages.Completion), so a decoded group re-encodes byte for byte."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise ProtocolError(f"text: cannot be written as UTF-8 ({e.reason})") from e


def to_wire(msg: Message, limits: Limits, shuffle: bool) -> list[Any]:
    """The msgpack-ready body of `msg` (checked against `limits`)."""
    s, t = limits.max_string_len, limits.max_text_len
    if isinstance(msg, RolloutGroup):
        return _group_to_wire(msg, limits, shuffle)
    if isinstance(msg, RolloutIndex):
        return _index_to_wire(msg, limits)
    if isinstance(msg, NodeStatus):
        if len(msg.metrics) > limits.max_metrics:
            raise ProtocolError(f"metrics: {len(msg.metrics)} entries exceeds {limits.max_metrics}")
        body = [_str(msg.peer_id, "peer_id", s), _str(msg.role, "role", s), _str(msg.model_id, "model_id", s),
                _int(msg.step, "step"), _float(msg.timestamp, "timestamp", False),
                [_str(m, "maddr", s) for m in _seq(msg.maddrs, "maddrs", limits.max_maddrs)],
                {_str(k, "metric key", limits.max_metric_key_len): _float(v, f"metrics[{k}]", False)
                 for k, v in sorted(msg.metrics.items())}]
        fingerprint = _str(msg.tokenizer_fingerprint, "tokenizer_fingerprint", s)
        span = _float(msg.receipts_span_s, "receipts_span_s", False)
        if msg.protocol_version <= 2 and (msg.receipts or span):
            raise ProtocolError(f"a version-{msg.protocol_version} status record cannot carry receipts")
        if msg.protocol_version == 1:
            if fingerprint:
                raise ProtocolError("a version-1 status record cannot carry a tokenizer fingerprint")
            return body
        if msg.protocol_version == 2:
            return [*body, fingerprint]
        return [*body, fingerprint, span, _receipts_to_wire(msg, limits)]
    if isinstance(msg, PromptSetManifest):
        b = limits.max_bytes_len
        return [_str(msg.prompt_set_id, "prompt_set_id", s), _str(msg.name, "name", s),
                _str(msg.answer_kind, "answer_kind", s), _int(msg.num_problems, "num_problems"),
                [_str(d, "digest", s) for d in _seq(msg.chunk_digests, "chunk_digests", limits.max_chunk_digests)],
                _bytes(msg.owner_public_key, "owner_public_key", b), _float(msg.created_at, "created_at", False),
                _bytes(msg.signature, "signature", b)]
    if isinstance(msg, PromptSetTombstone):
        b = limits.max_bytes_len
        return [_str(msg.prompt_set_id, "prompt_set_id", s), _bytes(msg.owner_public_key, "owner_public_key", b),
                _float(msg.ended_at, "ended_at", False), _str(msg.successor, "successor", s),
                _bytes(msg.signature, "signature", b)]
    if isinstance(msg, PromptChunk):
        items = _seq(msg.items, "items", limits.max_prompt_items)
        return [[[_int(i, "item index"), _str(q, "question", t), _str(a, "answer", t)]
                 for i, q, a in (_seq(it, "item", 3, exact=3) for it in items)]]
    raise ProtocolError(f"cannot encode {type(msg).__name__}")


def _index_to_wire(msg: RolloutIndex, limits: Limits) -> list[Any]:
    s, declares = limits.max_string_len, msg.protocol_version >= 4
    out = []
    for e in _seq(msg.entries, "entries", limits.max_index_entries):
        head = [[_str(d, "digest", s) for d in _seq(e.chunk_digests, "chunk_digests", limits.max_chunk_digests)],
                _int(e.size, "size", 0), _int(e.prompt_index, "prompt_index"),
                _int(e.policy_version, "policy_version"), _float(e.created_at, "created_at", False)]
        declaration = [_str(e.tokenizer_fingerprint, "tokenizer_fingerprint", s), _bool(e.has_text, "has_text"),
                       _int(e.group_size, "group_size", 0, limits.max_completions)]
        if not declares and (declaration[0] or declaration[1] or declaration[2]):
            raise ProtocolError(f"a version-{msg.protocol_version} index entry cannot declare its group")
        out.append(head + declaration if declares else head)
    return [_str(msg.sender, "sender", s), _int(msg.window, "window"), out]


def _index_from_wire(obj: Any, version: int, limits: Limits) -> RolloutIndex:
    s, n_fields = limits.max_string_len, 8 if version >= 4 else 5
    sender, window, entries = _seq(obj, "RolloutIndex", 3, exact=3)
    out = []
    for e in _seq(entries, "entries", limits.max_index_entries):
        digests, size, prompt_index, policy_version, created_at, *declared = _seq(e, "entry", 8, exact=n_fields)
        fingerprint, has_text, group_size = declared or ("", False, 0)
        out.append(IndexEntry(
            chunk_digests=_digests(digests, limits), size=_int(size, "size", 0),
            prompt_index=_int(prompt_index, "prompt_index"), policy_version=_int(policy_version, "policy_version"),
            created_at=_float(created_at, "created_at", True),
            tokenizer_fingerprint=_str(fingerprint, "tokenizer_fingerprint", s), has_text=_bool(has_text, "has_text"),
            group_size=_int(group_size, "group_size", 0, limits.max_completions)))
    return RolloutIndex(protocol_version=version, sender=_str(sender, "sender", s), window=_int(window, "window"),
                        entries=tuple(out))


RECEIPT_COUNTS = ("taken", "samples", "gradient", "filtered", "filtered_advantage", "filtered_kl")  # body order


def _receipts_to_wire(msg: NodeStatus, limits: Limits) -> list[Any]:
    s, out = limits.max_string_len, []
    for r in _seq(msg.receipts, "receipts", limits.max_receipts):
        if not isinstance(r, Receipt):
            raise ProtocolError(f"receipts: expected Receipt, got {type(r).__name__}")
        counts = [_int(getattr(r, f), f) for f in RECEIPT_COUNTS]
        dropped = [[_str(k, "reason", s), _int(n, "dropped")] for k, n in (
            _seq(d, "dropped reason", 2, exact=2) for d in _seq(r.dropped, "dropped", limits.max_receipt_reasons))]
        out.append([_str(r.sender, "sender", s), *counts, dropped])
    return out


def _receipts_from_wire(obj: Any, limits: Limits) -> tuple[Receipt, ...]:
    s, out = limits.max_string_len, []
    for r in _seq(obj, "receipts", limits.max_receipts):
        sender, *counts, dropped = _seq(r, "receipt", 8, exact=2 + len(RECEIPT_COUNTS))
        pairs = tuple((_str(k, "reason", s), _int(n, "dropped")) for k, n in (
            _seq(d, "dropped reason", 2, exact=2) for d in _seq(dropped, "dropped", limits.max_receipt_reasons)))
        out.append(Receipt(sender=_str(sender, "sender", s), dropped=pairs,
                           **{f: _int(v, f) for f, v in zip(RECEIPT_COUNTS, counts, strict=True)}))
    return tuple(out)


def _group_to_wire(g: RolloutGroup, limits: Limits, shuffle: bool) -> list[Any]:
    s = limits.max_string_len
    comps = _seq(g.completions, "completions", limits.max_completions)
    heads, total = [], 0
    for c in comps:
        if not isinstance(c, Completion):
            raise ProtocolError(f"completions: expected Completion, got {type(c).__name__}")
        n_tok, n_lp = int(c.token_ids.shape[0]), int(c.logprobs.shape[0])
        if max(n_tok, n_lp, int(c.piece_bytes.shape[0])) > limits.max_tokens_per_completion:
            raise ProtocolError(f"completion of {max(n_tok, n_lp)} tokens exceeds {limits.max_tokens_per_completion}")
        total += max(n_tok, n_lp)
        heads.append([n_tok, n_lp, _str(c.finish_reason, "finish_reason", s),
                      _float(c.claimed_reward, "claimed_reward", False)])
    if total > limits.max_total_tokens:
        raise ProtocolError(f"group of {total} tokens exceeds {limits.max_total_tokens}")
    tokens = b"".join(c.token_ids.astype("<u4", copy=False).tobytes() for c in comps)
    logprobs = b"".join(c.logprobs.astype("<f4", copy=False).tobytes() for c in comps)
    if shuffle:
        tokens, logprobs = shuffle_bytes(tokens), shuffle_bytes(logprobs)
    tail: list[Any] = [tokens, logprobs]
    if any(c.has_text for c in comps):
        if g.protocol_version == 1:
            raise ProtocolError("a version-1 group cannot carry completion text")
        texts = [_text_bytes(c.text) for c in comps]
        for head, c, text in zip(heads, comps, texts):
            head += [len(text), int(c.piece_bytes.shape[0])]
        pieces = b"".join(c.piece_bytes.astype("<u2", copy=False).tobytes() for c in comps)
        tail += [b"".join(texts), shuffle_bytes(pieces, 2) if shuffle else pieces]
    p, sp = g.prompt, g.sampling
    if not isinstance(p, PromptRef) or not isinstance(sp, SamplingParams):
        raise ProtocolError("prompt must be a PromptRef and sampling a SamplingParams")
    adapter = [_str(g.adapter_digest, "adapter_digest", s)]
    if g.protocol_version == 1:
        if adapter[0]:
            raise ProtocolError("a version-1 group cannot carry an adapter digest")
        adapter = []
    return [
        _str(g.swarm_id, "swarm_id", s), _str(g.sender, "sender", s), _str(g.model_id, "model_id", s),
        _str(g.model_revision, "model_revision", s), *adapter,
        _str(g.tokenizer_fingerprint, "tokenizer_fingerprint", s),
        _int(g.policy_version, "policy_version"), _float(g.created_at, "created_at", False),
        [_str(p.prompt_set_id, "prompt_set_id", s), _int(p.index, "prompt index"), _str(p.sha256, "sha256", s)],
        [_float(sp.temperature, "temperature", False), _float(sp.top_p, "top_p", False),
         _int(sp.max_new_tokens, "max_new_tokens")],
        heads, *tail,
    ]


def from_wire(kind: str, obj: Any, version: int, limits: Limits, shuffled: bool) -> Message:
    """Build the message of type `kind` (a MessageType name) from an unpacked body."""
    s, t = limits.max_string_len, limits.max_text_len
    if kind == "ROLLOUT_GROUP":
        return _group_from_wire(obj, version, limits, shuffled)
    if kind == "ROLLOUT_INDEX":
        return _index_from_wire(obj, version, limits)
    if kind == "NODE_STATUS":
        n_fields = {1: 7, 2: 8}.get(version, 10)
        peer_id, role, model_id, step, timestamp, maddrs, metrics, *rest = _seq(obj, "NodeStatus", 10, exact=n_fields)
        if not isinstance(metrics, dict):
            raise ProtocolError(f"metrics: expected map, got {type(metrics).__name__}")
        if len(metrics) > limits.max_metrics:
            raise ProtocolError(f"metrics: {len(metrics)} entries exceeds {limits.max_metrics}")
        return NodeStatus(
            protocol_version=version, peer_id=_str(peer_id, "peer_id", s), role=_str(role, "role", s),
            model_id=_str(model_id, "model_id", s), step=_int(step, "step"),
            timestamp=_float(timestamp, "timestamp", True),
            maddrs=tuple(_str(m, "maddr", s) for m in _seq(maddrs, "maddrs", limits.max_maddrs)),
            metrics={_str(k, "metric key", limits.max_metric_key_len): _float(v, "metric value", True)
                     for k, v in metrics.items()},
            tokenizer_fingerprint=_str(rest[0], "tokenizer_fingerprint", s) if rest else "",
            receipts_span_s=_float(rest[1], "receipts_span_s", True) if len(rest) > 1 else 0.0,
            receipts=_receipts_from_wire(rest[2], limits) if len(rest) > 1 else (),
        )
    if kind == "PROMPT_SET_MANIFEST":
        ps_id, name, answer_kind, num, digests, owner, created_at, sig = _seq(obj, "PromptSetManifest", 8, exact=8)
        return PromptSetManifest(
            protocol_version=version, prompt_set_id=_str(ps_id, "prompt_set_id", s), name=_str(name, "name", s),
            answer_kind=_str(answer_kind, "answer_kind", s), num_problems=_int(num, "num_problems"),
            chunk_digests=_digests(digests, limits),
            owner_public_key=_bytes(owner, "owner_public_key", limits.max_bytes_len),
            created_at=_float(created_at, "created_at", True), signature=_bytes(sig, "signature", limits.max_bytes_len),
        )
    if kind == "PROMPT_SET_TOMBSTONE":
        ps_id, owner, ended_at, successor, sig = _seq(obj, "PromptSetTombstone", 5, exact=5)
        return PromptSetTombstone(
            protocol_version=version, prompt_set_id=_str(ps_id, "prompt_set_id", s),
            owner_public_key=_bytes(owner, "owner_public_key", limits.max_bytes_len),
            ended_at=_float(ended_at, "ended_at", True), successor=_str(successor, "successor", s),
            signature=_bytes(sig, "signature", limits.max_bytes_len),
        )
    if kind == "PROMPT_CHUNK":
        (items,) = _seq(obj, "PromptChunk", 1, exact=1)
        out_items = []
        for it in _seq(items, "items", limits.max_prompt_items):
            i, q, a = _seq(it, "item", 3, exact=3)
            out_items.append((_int(i, "item index"), _str(q, "question", t), _str(a, "answer", t)))
        return PromptChunk(protocol_version=version, items=tuple(out_items))
    raise ProtocolError(f"unknown message type {kind}")


def _group_from_wire(obj: Any, version: int, limits: Limits, shuffled: bool) -> RolloutGroup:
    s = limits.max_string_len
    body = list(_seq(obj, "RolloutGroup", GROUP_FIELDS_WITH_TEXT))
    with_text = version != 1 and len(body) == GROUP_FIELDS_WITH_TEXT
    exact = GROUP_FIELDS_V1 if version == 1 else GROUP_FIELDS_WITH_TEXT if with_text else GROUP_FIELDS
    _seq(body, "RolloutGroup", GROUP_FIELDS_WITH_TEXT, exact=exact)
    adapter = body.pop(4) if version != 1 else ""
    (swarm_id, sender, model_id, revision, fingerprint, policy_version, created_at,
     prompt, sampling, heads, tok_bytes, lp_bytes, *text_fields) = body
    ps_id, index, sha = _seq(prompt, "prompt", 3, exact=3)
    temperature, top_p, max_new = _seq(sampling, "sampling", 3, exact=3)
    sizes, cap = [], limits.max_tokens_per_completion
    for h in _seq(heads, "completions", limits.max_completions):
        n_tok, n_lp, finish, reward, *text_sizes = _seq(h, "completion", 6, exact=6 if with_text else 4)
        sizes.append((_int(n_tok, "n_tokens", 0, cap), _int(n_lp, "n_logprobs", 0, cap),
                      _str(finish, "finish_reason", s), _float(reward, "claimed_reward", True),
                      *(_int(n, what, 0, hi) for n, what, hi in zip(
                          text_sizes, ("n_text_bytes", "n_pieces"), (limits.max_decoded_bytes, cap)))))
    total_tok, total_lp = sum(x[0] for x in sizes), sum(x[1] for x in sizes)
    if max(total_tok, total_lp) > limits.max_total_tokens:
        raise ProtocolError(f"group of {max(total_tok, total_lp)} tokens exceeds {limits.max_total_tokens}")
    tok_bytes = _bytes(tok_bytes, "token bytes", 4 * total_tok)
    lp_bytes = _bytes(lp_bytes, "logprob bytes", 4 * total_lp)
    if len(tok_bytes) != 4 * total_tok or len(lp_bytes) != 4 * total_lp:
        raise ProtocolError("token/logprob byte strings do not match the completion lengths")
    if shuffled:
        tokens, logprobs = unshuffle(tok_bytes, "<u4"), unshuffle(lp_bytes, "<f4")
        tokens.flags.writeable = logprobs.flags.writeable = False
    else:
        tokens, logprobs = np.frombuffer(tok_bytes, "<u4"), np.frombuffer(lp_bytes, "<f4")
    texts, pieces = _texts_from_wire(text_fields, sizes, shuffled) if with_text else ([""] * len(sizes), None)
    completions, ot, ol, op = [], 0, 0, 0
    for (n_tok, n_lp, finish, reward, *text_sizes), text in zip(sizes, texts):
        n_pieces = text_sizes[1] if text_sizes else 0
        completion_pieces = pieces[op : op + n_pieces] if pieces is not None else np.zeros(0, np.uint16)
        completions.append(Completion(token_ids=tokens[ot : ot + n_tok], logprobs=logprobs[ol : ol + n_lp],
                                      finish_reason=finish, claimed_reward=reward, text=text,
                                      piece_bytes=completion_pieces))
        ot, ol, op = ot + n_tok, ol + n_lp, op + n_pieces
    return RolloutGroup(
        protocol_version=version, swarm_id=_str(swarm_id, "swarm_id", s), sender=_str(sender, "sender", s),
        model_id=_str(model_id, "model_id", s), model_revision=_str(revision, "model_revision", s),
        adapter_digest=_str(adapter, "adapter_digest", s),
        tokenizer_fingerprint=_str(fingerprint, "tokenizer_fingerprint", s),
        policy_version=_int(policy_version, "policy_version"), created_at=_float(created_at, "created_at", True),
        prompt=PromptRef(prompt_set_id=_str(ps_id, "prompt_set_id", s), index=_int(index, "prompt index"),
                         sha256=_str(sha, "sha256", s)),
        sampling=SamplingParams(temperature=_float(temperature, "temperature", True),
                                top_p=_float(top_p, "top_p", True), max_new_tokens=_int(max_new, "max_new_tokens")),
        completions=tuple(completions),
    )


def _texts_from_wire(fields: list[Any], sizes: list[tuple[Any, ...]], shuffled: bool) -> tuple[list[str], np.ndarray]:
    """Each completion's text and all completions' piece lengths from a body's two text fields.
    Undecodable UTF-8 is kept as lone surrogates (validate rejects it; re-encoding restores it)."""
    text_bytes, piece_bytes = fields
    n_text, n_pieces = sum(x[4] for x in sizes), sum(x[5] for x in sizes)
    text_bytes = _bytes(text_bytes, "text bytes", n_text)
    piece_bytes = _bytes(piece_bytes, "piece bytes", 2 * n_pieces)
    if len(text_bytes) != n_text or len(piece_bytes) != 2 * n_pieces:
        raise ProtocolError("text/piece byte strings do not match the completion lengths")
    if not any(x[4] or x[5] for x in sizes):
        raise ProtocolError("text fields present but no completion carries text")  # canonical: omit them
    pieces = unshuffle(piece_bytes, "<u2", 2) if shuffled else np.frombuffer(piece_bytes, "<u2")
    pieces.flags.writeable = False
    texts, start = [], 0
    for x in sizes:
        texts.append(text_bytes[start : start + x[4]].decode("utf-8", "surrogateescape"))
        start += x[4]
    return texts, pieces
