"""A node takes a peer group from another tokenizer when it carries its texts (peer_rollouts.peer_samples):
samples in this node's tokens with chunk ids, rewards from the texts; drops counted by reason."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from protocol.messages import Completion, PromptRef, RolloutGroup, SamplingParams
from swarm_node.node import peer_rollouts
from swarm_node.peers.crosstok_receive import DROP_TEXT_ROUNDTRIP, own_piece_bytes
from swarm_node.policy import tiny
from swarm_node.node.parts import NodeParts
from swarm_node.policy.models import tokenizer_fingerprint
from swarm_node.swarm.admission import Admission
from swarm_node.swarm.exchange import RolloutExchange
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from tests.fakes import hash_reward
from tests.unit.test_node_loop import make_node


def TextCompletion(token_ids, logprobs, finish_reason, claimed_reward, text, piece_bytes) -> Completion:  # noqa: N802
    """A wire completion with the text fields a cross-tokenizer sender adds."""
    return Completion(token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason,
                      claimed_reward=claimed_reward, text=text, piece_bytes=piece_bytes)


SENDER = tiny.build_tiny_tokenizer("a")
TEXTS = ["12 + 3 = 15", "the answer is \\boxed{15}", "7 \u20ac", "no idea"]


def completion(text: str, *, pieces_ok: bool = True) -> TextCompletion:
    ids = [*SENDER.encode(text, add_special_tokens=False), SENDER.eos_token_id]
    pieces = np.append(own_piece_bytes(SENDER, ids[:-1], text), 0)
    logprobs = -np.linspace(0.1, 2.0, len(ids)).astype(np.float32)
    return TextCompletion(np.asarray(ids, np.uint32), logprobs, "stop", 0.0, text if pieces_ok else text + "\u00e9",
                          pieces.astype(np.uint16))


def group(parts: NodeParts, completions: list, fingerprint: str = tokenizer_fingerprint(SENDER)) -> RolloutGroup:
    problem = parts.prompt_set.problems[3]
    return RolloutGroup(
        swarm_id=parts.config.swarm.swarm_id, sender="peer-a", model_id="tiny-random:64x1:a", model_revision="",
        tokenizer_fingerprint=fingerprint, policy_version=1, created_at=0.0,
        prompt=PromptRef(prompt_set_id=parts.prompt_set.id, index=problem.index, sha256=problem.sha256),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=32), completions=tuple(completions))


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> NodeParts:
    node = make_node(tmp_path_factory.mktemp("n"), MemorySwarm(), "C", model="tiny-random:64x1:c")
    assert node.parts.policy.fingerprint != tokenizer_fingerprint(SENDER)
    return node.parts


def test_foreign_group_with_texts_becomes_chunked_samples(parts: NodeParts) -> None:
    drops: Counter[str] = Counter()
    batch = peer_rollouts.peer_samples(parts, [group(parts, [completion(t) for t in TEXTS])], 4, drops, step=0)
    assert not drops and batch.groups == 1 and len(batch.samples) == 4
    tok = parts.policy.tokenizer
    for s, text in zip(batch.samples, TEXTS, strict=True):
        assert s.chunk_ids is not None and s.is_peer and s.source == "peer-a"
        assert tok.decode(s.completion_ids.tolist(), skip_special_tokens=True) == text
        assert s.reward == hash_reward(text, None)  # recomputed from the text
    assert batch.crosstok_tokens == sum(len(s.completion_ids) for s in batch.samples)


def test_unusable_foreign_groups_are_dropped_by_reason(parts: NodeParts) -> None:
    drops: Counter[str] = Counter()
    broken = [completion(TEXTS[0]), completion(TEXTS[1], pieces_ok=False)]  # text and pieces disagree
    plain = [Completion(token_ids=c.token_ids, logprobs=c.logprobs, finish_reason="stop", claimed_reward=0.0)
             for c in (completion(t) for t in TEXTS[:2])]  # a sender that sends no texts
    batch = peer_rollouts.peer_samples(parts, [group(parts, broken), group(parts, plain)], 4, drops, step=0)
    assert batch.samples == [] and drops == Counter({"piece_bytes": 1, peer_rollouts.DROP_TOKENIZER: 1})
    text = "x<|im_end|>y"  # a special token spelled out (by a sender without it) is no text of this node's
    n = len(text) + 1
    roundtrip = TextCompletion(np.arange(n, dtype=np.uint32), np.full(n, -1.0, np.float32), "stop", 0.0, text,
                               np.append(np.ones(n - 1), 0).astype(np.uint16))
    peer_rollouts.peer_samples(parts, [group(parts, [roundtrip])], 4, drops, step=0)
    assert drops[DROP_TEXT_ROUNDTRIP] == 1


def with_admission(parts: NodeParts, admission: Admission) -> NodeParts:
    """`parts` whose exchange (a real one, over its own in-memory swarm) applies `admission`."""
    exchange = RolloutExchange(MemoryTransport(MemorySwarm(), "C2"), parts.config.swarm.swarm_id,
                               vocab_size=len(parts.policy.tokenizer), admission=admission)
    return dataclasses.replace(parts, exchange=exchange)


def test_cross_tokenizer_switch_off_drops_foreign_groups(parts: NodeParts) -> None:
    cfg = parts.config
    off = dataclasses.replace(parts, config=cfg.model_copy(update={
        "swarm": cfg.swarm.model_copy(update={"cross_tokenizer": False})}))
    drops: Counter[str] = Counter()
    batch = peer_rollouts.peer_samples(off, [group(parts, [completion(t) for t in TEXTS])], 4, drops, step=0)
    assert batch.samples == [] and drops == Counter({peer_rollouts.DROP_TOKENIZER: 1})


def coarse(text: str) -> Completion:
    """A sender whose tokenizer made the whole text one token (then eos): any receiver needs more."""
    return TextCompletion(np.array([70_000, 70_001], np.uint32), np.array([-1.0, -0.5], np.float32), "stop", 0.0,
                          text, np.array([len(text.encode()), 0], np.uint16))


def test_conversion_counts_in_the_peer_budgets(parts: NodeParts) -> None:
    """Own tokens beyond the sender's are charged to the gather's token budget, and the conversion's
    time to the verification budget: a group that does not fit is dropped by the budget's reason."""
    from swarm_node.swarm.admission import OVER_TOKEN_BUDGET
    from swarm_node.tasks.verify import VERIFY_BUDGET

    g = group(parts, [coarse(t) for t in TEXTS])
    charged: list[int] = []
    admission = Admission(max_tokens_per_gather=10)
    admission.begin_gather()
    original = admission.charge_tokens
    admission.charge_tokens = lambda n: charged.append(n) or original(n)  # type: ignore[method-assign]
    tight = with_admission(parts, admission)
    drops: Counter[str] = Counter()
    batch = peer_rollouts.peer_samples(tight, [g], 4, drops, step=0)
    assert batch.samples == [] and drops == Counter({OVER_TOKEN_BUDGET: 1})
    assert charged == [batch.crosstok_tokens - g.num_tokens] and charged[0] > 10
    roomy = Admission(max_tokens_per_gather=10_000)
    roomy.begin_gather()
    ok = with_admission(parts, roomy)
    drops = Counter()
    assert len(peer_rollouts.peer_samples(ok, [g], 4, drops, step=0).samples) == 4 and not drops
    spent = peer_rollouts.peer_verifier(parts)
    spent.spent = spent.step_budget_s  # this gather's verification time is used up
    drops = Counter()
    assert peer_rollouts.peer_samples(parts, [g], 4, drops, step=0, verifier=spent).samples == []
    assert drops == Counter({VERIFY_BUDGET: 1})


def test_the_ledger_records_each_senders_tokenizer_and_conversion_drops(parts: NodeParts) -> None:
    from swarm_node.peers.ledger import PeerLedger

    ledger = PeerLedger(None, own_tokenizer=parts.policy.fingerprint)
    with_ledger = dataclasses.replace(parts, ledger=ledger)
    broken = [completion(TEXTS[0]), completion(TEXTS[1], pieces_ok=False)]
    drops: Counter[str] = Counter()
    peer_rollouts.peer_samples(with_ledger, [group(parts, [completion(t) for t in TEXTS]), group(parts, broken)], 4,
                          drops, step=0)
    (row,) = ledger.rows()
    assert row["peer_id"] == "peer-a" and row["tokenizer"] == tokenizer_fingerprint(SENDER)
    assert row["tokenizer_same"] is False
    assert (row["offered"], row["taken"], row["dropped_by_reason"]) == (2, 1, {"piece_bytes": 1})
