"""The trainer with cross-tokenizer samples: chunk ids of one token per chunk give exactly today's
step; samples received from another tokenizer train this node's model through their chunks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from swarm_node.config import ModelConfig, ObjectiveConfig, TrainConfig
from swarm_node.peers.crosstok_receive import own_piece_bytes, receive_group, train_samples
from swarm_node.policy.models import Policy, load_policy
from swarm_node.policy.scoring import token_logprobs
from swarm_node.policy.trainer import Trainer
from swarm_node.policy.types import TrainSample
from swarm_node.tasks.prompts import render_prompt
from tests.unit.test_crosstok_receive import Sent
from tests.unit.test_policy_trainer import cache, make_samples, params  # noqa: F401 (cache: a fixture)

FTIS = ObjectiveConfig(variant="f-tis")


def policy(cache: Path, variant: str = "a") -> Policy:
    return load_policy(ModelConfig(name=f"tiny-random:64x2:{variant}", cache_dir=cache, device="cpu"))


def test_positions_as_chunk_ids_give_exactly_the_same_step(cache: Path) -> None:
    base = policy(cache)
    own = make_samples(base, [[1.0, 0.0, 0.5]], seed=1)
    peer = make_samples(base, [[0.0, 1.0, 1.0]], peer=True, seed=2)
    peer = [dataclasses.replace(s, generator_logprobs=s.generator_logprobs - 0.3) for s in peer]  # off-policy
    chunked = [dataclasses.replace(s, chunk_ids=np.arange(len(s.completion_ids))) for s in peer]
    results = []
    for samples in (own + peer, own + chunked):
        p = policy(cache)
        metrics = Trainer(p, TrainConfig(learning_rate=1e-3, micro_batch_size=2, epochs_per_batch=2), FTIS,
                          1.0).step(samples)
        results.append((metrics, params(p)))
    (m0, p0), (m1, p1) = results
    assert (m0.pop("crosstok_samples"), m1.pop("crosstok_samples")) == (0, 3)  # batch composition
    assert (m0.pop("crosstok_tokens_per_chunk"), m1.pop("crosstok_tokens_per_chunk")) == (0, 1)
    assert m0 == m1 and m0["optimizer_steps"] == 2 and m0["is_weight_peer_mean"] != 1.0
    assert all(torch.equal(p0[n], p1[n]) for n in p0)


def foreign_group(sender: Policy, receiver: Policy, texts: list[str], rewards: list[float]) -> list[TrainSample]:
    """Completions written by `sender` (its tokens of `texts` + EOS, logprobs under its model) as
    `receiver` takes them in (receive_group), prompts rendered with the receiver's template."""
    stok, rtok = sender.tokenizer, receiver.tokenizer
    prompt = render_prompt(stok, "What is 12 + 3?")
    sent = []
    for text in texts:
        ids = [*stok.encode(text, add_special_tokens=False), stok.eos_token_id]
        with torch.no_grad():
            logprobs = token_logprobs(sender.model, [prompt], [ids], 1.0, 1)[0].numpy()
        pieces = np.append(own_piece_bytes(stok, ids[:-1], text), 0).astype(np.uint16)
        sent.append(Sent(text, pieces, logprobs, "stop"))
    own_prompt = np.asarray(render_prompt(rtok, "What is 12 + 3?"), dtype=np.int64)
    got = receive_group(rtok, rtok.eos_token_id, sent)
    assert got.reason is None
    return train_samples(got.views, rewards, prompt_ids=own_prompt, group_key="peer:0:1", source="peer-a")


TEXTS = ["12 + 3 = 15, so the answer is 15.", "The answer is 9 \u20ac"]


@pytest.mark.parametrize(("sender_variant", "receiver_variant"), [("a", "c"), ("c", "a")])
def test_foreign_samples_train_the_receiver_through_their_chunks(cache: Path, sender_variant: str,
                                                                 receiver_variant: str) -> None:
    sender, receiver = policy(cache, sender_variant), policy(cache, receiver_variant)
    samples = foreign_group(sender, receiver, TEXTS, [1.0, 0.0])
    one_per_chunk = all(s.chunk_ids.tolist() == list(range(len(s.chunk_ids))) for s in samples)
    # tiny a's tokens are bytes and c's merge them: chunks are c's tokens, each several of a's
    assert one_per_chunk == (receiver_variant == "c")
    good = samples[0]

    def logprob() -> float:
        with torch.no_grad():
            return float(token_logprobs(receiver.model, [good.prompt_ids], [good.completion_ids], 1.0, 1)[0].sum())

    before = logprob()
    # two random models over different vocabularies: chunk KLs are far above the default g
    cfg = ObjectiveConfig(variant="f-tis", kl_threshold=1e12)
    trainer = Trainer(receiver, TrainConfig(learning_rate=1e-3), cfg, 1.0)
    metrics = trainer.step(samples)
    assert metrics["crosstok_samples"] == 2 and metrics["peer_samples"] == 2
    assert (metrics["crosstok_tokens_per_chunk"] == 1.0) == one_per_chunk and metrics["optimizer_steps"] == 1
    assert np.isfinite(metrics["loss"]) and metrics["is_weight_peer_mean"] > 0
    assert metrics["filtered_nonpositive_advantage"] == 1  # the 0-reward foreign sample
    assert logprob() > before  # the positive-advantage foreign sample became likelier
    # What the peer ledger counts: both came from another tokenizer, the rewarded one carried gradient.
    assert [(s.crosstok, s.gradient) for s in trainer.peer_sample_stats] == [(True, True), (True, False)]
