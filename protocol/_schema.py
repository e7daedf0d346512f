"""Field order and type checks of each message body (the msgpack array inside the codec's frame).

`to_wire` turns a message into msgpack-ready lists, checking types and limits so we never write
what a peer would refuse; `from_wire` does the reverse on an unpacked body, checking every type,
length and count and raising ProtocolError with the field path. The protocol version travels in
the frame header, not in the body.

Bodies:
    RolloutGroup      [swarm_id, sender, model_id, model_revision, tokenizer_fingerprint,
                       policy_version, created_at, [prompt_set_id, index, sha256],
                       [temperature, top_p, max_new_tokens],
                       [[n_tokens, n_logprobs, finish_reason, claimed_reward], ...],
                       token_bytes (<u4, all completions), logprob_bytes (<f4, all completions)]
    RolloutIndex      [sender, window, [[[digest, ...], size, prompt_index, policy_version, created_at], ...]]
    NodeStatus        [peer_id, role, model_id, step, timestamp, [maddr, ...], {metric: value}]
    PromptSetManifest [prompt_set_id, name, answer_kind, num_problems, [digest, ...],
                       owner_public_key, created_at, signature]
    PromptChunk       [[[index, question, answer], ...]]
    PromptSetTombstone [prompt_set_id, owner_public_key, ended_at, successor, signature]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

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
    RolloutGroup,
    RolloutIndex,
    SamplingParams,
)

if TYPE_CHECKING:
    from protocol.codec import Limits

_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def _str(v: Any, what: str, max_len: int) -> str:
    if not isinstance(v, str):
        raise ProtocolError(f"{what}: expected str, got {type(v).__name__}")
    if len(v) > max_len:
        raise ProtocolError(f"{what}: string of length {len(v)} exceeds {max_len}")
    return v


def _int(v: Any, what: str, lo: int = _INT_MIN, hi: int = _INT_MAX) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
        raise ProtocolError(f"{what}: expected int, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ProtocolError(f"{what}: {v} outside [{lo}, {hi}]")
    return int(v)


def _float(v: Any, what: str, strict: bool) -> float:
    ok = isinstance(v, float) or (not strict and isinstance(v, (int, np.integer, np.floating)))
    if not ok or isinstance(v, bool):
        raise ProtocolError(f"{what}: expected float, got {type(v).__name__}")
    return float(v)


def _bytes(v: Any, what: str, max_len: int) -> bytes:
    if not isinstance(v, bytes):
        raise ProtocolError(f"{what}: expected bytes, got {type(v).__name__}")
    if len(v) > max_len:
        raise ProtocolError(f"{what}: {len(v)} bytes exceeds {max_len}")
    return v


def _seq(v: Any, what: str, max_len: int, exact: int | None = None) -> list[Any] | tuple[Any, ...]:
    if not isinstance(v, (list, tuple)):
        raise ProtocolError(f"{what}: expected array, got {type(v).__name__}")
    if exact is not None and len(v) != exact:
        raise ProtocolError(f"{what}: expected {exact} fields, got {len(v)}")
    if len(v) > max_len:
        raise ProtocolError(f"{what}: {len(v)} items exceeds {max_len}")
    return v


def _digests(v: Any, limits: Limits) -> tuple[str, ...]:
    return tuple(_str(d, "digest", limits.max_string_len) for d in _seq(v, "chunk_digests", limits.max_chunk_digests))


def shuffle_bytes(buf: bytes, width: int = 4) -> bytes:
    """Byte-transpose `buf` of width-byte items: all first bytes, then all second bytes, ..."""
    return np.frombuffer(buf, np.uint8).reshape(-1, width).T.tobytes()


def unshuffle(buf: bytes, dtype: str, width: int = 4) -> np.ndarray:
    planes = np.frombuffer(buf, np.uint8).reshape(width, -1)
    return planes.T.copy().view(dtype).reshape(-1)


def to_wire(msg: Message, limits: Limits, shuffle: bool) -> list[Any]:
    """The msgpack-ready body of `msg` (checked against `limits`)."""
    s, t = limits.max_string_len, limits.max_text_len
    if isinstance(msg, RolloutGroup):
        return _group_to_wire(msg, limits, shuffle)
    if isinstance(msg, RolloutIndex):
        entries = _seq(msg.entries, "entries", limits.max_index_entries)
        return [_str(msg.sender, "sender", s), _int(msg.window, "window"), [
            [[_str(d, "digest", s) for d in _seq(e.chunk_digests, "chunk_digests", limits.max_chunk_digests)],
             _int(e.size, "size", 0), _int(e.prompt_index, "prompt_index"),
             _int(e.policy_version, "policy_version"), _float(e.created_at, "created_at", False)]
            for e in entries
        ]]
    if isinstance(msg, NodeStatus):
        if len(msg.metrics) > limits.max_metrics:
            raise ProtocolError(f"metrics: {len(msg.metrics)} entries exceeds {limits.max_metrics}")
        return [_str(msg.peer_id, "peer_id", s), _str(msg.role, "role", s), _str(msg.model_id, "model_id", s),
                _int(msg.step, "step"), _float(msg.timestamp, "timestamp", False),
                [_str(m, "maddr", s) for m in _seq(msg.maddrs, "maddrs", limits.max_maddrs)],
                {_str(k, "metric key", limits.max_metric_key_len): _float(v, f"metrics[{k}]", False)
                 for k, v in sorted(msg.metrics.items())}]
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


def _group_to_wire(g: RolloutGroup, limits: Limits, shuffle: bool) -> list[Any]:
    s = limits.max_string_len
    comps = _seq(g.completions, "completions", limits.max_completions)
    heads, total = [], 0
    for c in comps:
        if not isinstance(c, Completion):
            raise ProtocolError(f"completions: expected Completion, got {type(c).__name__}")
        n_tok, n_lp = int(c.token_ids.shape[0]), int(c.logprobs.shape[0])
        if max(n_tok, n_lp) > limits.max_tokens_per_completion:
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
    p, sp = g.prompt, g.sampling
    if not isinstance(p, PromptRef) or not isinstance(sp, SamplingParams):
        raise ProtocolError("prompt must be a PromptRef and sampling a SamplingParams")
    return [
        _str(g.swarm_id, "swarm_id", s), _str(g.sender, "sender", s), _str(g.model_id, "model_id", s),
        _str(g.model_revision, "model_revision", s), _str(g.tokenizer_fingerprint, "tokenizer_fingerprint", s),
        _int(g.policy_version, "policy_version"), _float(g.created_at, "created_at", False),
        [_str(p.prompt_set_id, "prompt_set_id", s), _int(p.index, "prompt index"), _str(p.sha256, "sha256", s)],
        [_float(sp.temperature, "temperature", False), _float(sp.top_p, "top_p", False),
         _int(sp.max_new_tokens, "max_new_tokens")],
        heads, tokens, logprobs,
    ]


def from_wire(kind: str, obj: Any, version: int, limits: Limits, shuffled: bool) -> Message:
    """Build the message of type `kind` (a MessageType name) from an unpacked body."""
    s, t = limits.max_string_len, limits.max_text_len
    if kind == "ROLLOUT_GROUP":
        return _group_from_wire(obj, version, limits, shuffled)
    if kind == "ROLLOUT_INDEX":
        sender, window, entries = _seq(obj, "RolloutIndex", 3, exact=3)
        out = []
        for e in _seq(entries, "entries", limits.max_index_entries):
            digests, size, prompt_index, policy_version, created_at = _seq(e, "entry", 5, exact=5)
            out.append(IndexEntry(
                chunk_digests=_digests(digests, limits),
                size=_int(size, "size", 0), prompt_index=_int(prompt_index, "prompt_index"),
                policy_version=_int(policy_version, "policy_version"),
                created_at=_float(created_at, "created_at", True),
            ))
        return RolloutIndex(protocol_version=version, sender=_str(sender, "sender", s),
                            window=_int(window, "window"), entries=tuple(out))
    if kind == "NODE_STATUS":
        peer_id, role, model_id, step, timestamp, maddrs, metrics = _seq(obj, "NodeStatus", 7, exact=7)
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
    (swarm_id, sender, model_id, revision, fingerprint, policy_version, created_at,
     prompt, sampling, heads, tok_bytes, lp_bytes) = _seq(obj, "RolloutGroup", 12, exact=12)
    ps_id, index, sha = _seq(prompt, "prompt", 3, exact=3)
    temperature, top_p, max_new = _seq(sampling, "sampling", 3, exact=3)
    sizes = []
    for h in _seq(heads, "completions", limits.max_completions):
        n_tok, n_lp, finish, reward = _seq(h, "completion", 4, exact=4)
        cap = limits.max_tokens_per_completion
        sizes.append((_int(n_tok, "n_tokens", 0, cap), _int(n_lp, "n_logprobs", 0, cap),
                      _str(finish, "finish_reason", s), _float(reward, "claimed_reward", True)))
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
    completions, ot, ol = [], 0, 0
    for n_tok, n_lp, finish, reward in sizes:
        completions.append(Completion(token_ids=tokens[ot : ot + n_tok], logprobs=logprobs[ol : ol + n_lp],
                                      finish_reason=finish, claimed_reward=reward))
        ot, ol = ot + n_tok, ol + n_lp
    return RolloutGroup(
        protocol_version=version, swarm_id=_str(swarm_id, "swarm_id", s), sender=_str(sender, "sender", s),
        model_id=_str(model_id, "model_id", s), model_revision=_str(revision, "model_revision", s),
        tokenizer_fingerprint=_str(fingerprint, "tokenizer_fingerprint", s),
        policy_version=_int(policy_version, "policy_version"), created_at=_float(created_at, "created_at", True),
        prompt=PromptRef(prompt_set_id=_str(ps_id, "prompt_set_id", s), index=_int(index, "prompt index"),
                         sha256=_str(sha, "sha256", s)),
        sampling=SamplingParams(temperature=_float(temperature, "temperature", True),
                                top_p=_float(top_p, "top_p", True), max_new_tokens=_int(max_new, "max_new_tokens")),
        completions=tuple(completions),
    )
