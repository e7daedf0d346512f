"""The sender's side of cross-tokenizer exchange: when own groups carry completion text
(`swarm.send_text`), what they carry, and the census of tokenizers it is decided from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from protocol.messages import RolloutGroup
from protocol.validate import ValidationLimits, validate_group
from swarm_node.node.loop import Node
from swarm_node.policy.types import GeneratedCompletion
from swarm_node.swarm.memory import MemorySwarm
from swarm_node.swarm.tokenizers import MAX_FINGERPRINTS, TokenizerCensus
from tests.unit.test_node_loop import make_node


def capture_published(node: Node) -> list[RolloutGroup]:
    """The groups `node` publishes from now on (the exchange still publishes them)."""
    published: list[RolloutGroup] = []
    exchange = node.parts.exchange
    original = exchange.publish_groups

    def publish(groups, window):
        published.extend(groups)
        return original(groups, window)

    exchange.publish_groups = publish
    return published


UNICODE_ANSWERS = ["caf\u00e9 = 4", "\u6771\u4eac 7", "\U0001f600 2", "x\u00b2=9"]


def answer_with(node: Node, ids_of: Callable[[Any, int], list[int]], logprob: float, finish_reason: str) -> None:
    """Make `node`'s generator answer the k-th completion of every group with `ids_of(tokenizer, k)`
    (each token's logprob `logprob`), after sampling as usual."""
    tok, generator = node.parts.policy.tokenizer, node.parts.generator
    original = generator.generate

    def generate(prompt_ids, n):
        out = original(prompt_ids, n)
        for group in out:
            for k, _ in enumerate(group):
                ids = ids_of(tok, k)
                group[k] = GeneratedCompletion(token_ids=np.array(ids, np.int64),
                                               logprobs=np.full(len(ids), logprob, np.float32),
                                               finish_reason=finish_reason)
        return out

    generator.generate = generate


def speak_unicode(node: Node) -> None:
    """Make `node`'s generator answer with unicode text (a random tiny model samples random bytes,
    mostly not UTF-8, for which no text is sent): tokens of UNICODE_ANSWERS, then eos."""
    answer_with(node, lambda tok, k: [*tok.encode(UNICODE_ANSWERS[k % 4], add_special_tokens=False), tok.eos_token_id],
                -1.5, "stop")


def assert_exact_text(node: Node, group: RolloutGroup) -> None:
    tok = node.parts.policy.tokenizer
    for c in group.completions:
        assert c.piece_bytes.shape == c.token_ids.shape
        assert c.text == tok.decode(c.token_ids.tolist(), skip_special_tokens=True)
        assert int(c.piece_bytes.sum()) == len(c.text.encode("utf-8"))
        if c.finish_reason == "stop":
            assert c.piece_bytes[-1] == 0  # the eos adds no text


def test_auto_sends_text_once_another_tokenizer_is_seen(tmp_path: Path) -> None:
    swarm = MemorySwarm()
    b = make_node(tmp_path, swarm, "B", model="tiny-random:64x1:b")
    a = make_node(tmp_path, swarm, "A", extra=["generation.max_new_tokens=16"])
    speak_unicode(a)
    sent = capture_published(a)
    assert b.run_step()["text_groups"] == 0  # alone with its tokenizer: nothing to say
    m1 = a.run_step()  # sees B's group (and status record) while it publishes its first
    assert m1["dropped_tokenizer_mismatch"] >= 1
    m2 = a.run_step()
    assert m2["text_groups"] == 2 and m2["text_withheld"] == 0
    texted = [g for g in sent if all(c.has_text for c in g.completions)]
    assert len(texted) >= 2
    for g in texted:
        assert_exact_text(a, g)
        assert validate_group(g, ValidationLimits(vocab_size=len(a.parts.policy.tokenizer))) == []
    census = a.parts.exchange.tokenizers
    assert census.others(swarm.clock()) == [b.parts.policy.fingerprint]
    statuses = {s.peer_id: s for s in a.parts.exchange.read_statuses(timeout=1.0)}
    assert statuses["B"].tokenizer_fingerprint == b.parts.policy.fingerprint


def test_never_and_always(tmp_path: Path) -> None:
    swarm = MemorySwarm()
    b = make_node(tmp_path, swarm, "B", model="tiny-random:64x1:b", extra=['swarm.send_text="never"'])
    a = make_node(tmp_path, swarm, "A", extra=['swarm.send_text="never"'])
    b.run_step()
    a.run_step()
    assert a.run_step()["text_groups"] == 0  # another tokenizer is seen, but never is never
    c = make_node(tmp_path, swarm, "C", model="tiny-random:96x1:a", extra=['swarm.send_text="always"'])
    m = c.run_step()  # a random model: random bytes, rarely UTF-8; such groups go without text
    assert m["text_groups"] + m["text_withheld"] == 2
    speak_unicode(c)
    sent = capture_published(c)
    assert c.run_step()["text_groups"] == 2
    assert sent and all(c_.has_text for g in sent for c_ in g.completions)
    for g in sent:
        assert_exact_text(c, g)
    # A same-tokenizer peer takes groups with text like any other (it scores the tokens).
    m = make_node(tmp_path, swarm, "D", extra=['swarm.send_text="never"']).run_step()
    assert m["peer_groups"] >= 1


def test_census_forgets_and_is_bounded() -> None:
    census = TokenizerCensus("mine", ttl_s=100.0)
    census.note("mine", 0.0)
    census.note("", 0.0)  # observers name none
    assert census.others(0.0) == []
    census.note("theirs", 10.0)
    assert census.others(50.0) == ["theirs"]
    assert census.others(111.0) == []  # not seen for longer than ttl_s
    for i in range(MAX_FINGERPRINTS + 10):
        census.note(f"fp{i}", 200.0 + i)
    others = census.others(300.0)
    assert len(others) <= MAX_FINGERPRINTS and others[-1] == f"fp{MAX_FINGERPRINTS + 9}"
    assert census.statuses_due(0.0) and not census.statuses_due(20.0) and census.statuses_due(40.0)
    assert np.isfinite(census.ttl_s)
