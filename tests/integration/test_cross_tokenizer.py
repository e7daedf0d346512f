"""Two nodes with different tokenizers train on each other's groups over real hivemind DHTs.

Warm tiny models (the `warm_model` fixture) write valid text: variant a has byte tokens, variant c
a byte-level BPE trained in code. With the defaults (`swarm.send_text = "auto"`,
`swarm.cross_tokenizer = true`) each node learns the other's tokenizer from its status record or
its groups, starts sending completion text, and takes the other's groups, re-tokenized and
trained per aligned chunk. Slow: warming the two models up and starting the DHTs take most of it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from swarm_node.node.assemble import build_parts, start_transport
from swarm_node.config import NodeConfig
from swarm_node.node.loop import Node

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]
SWARM = "itest-crosstok"
MAX_ROUNDS = 6  # rounds (one step of each node) allowed for text to start flowing both ways
MORE_ROUNDS = 4  # rounds after that, until a cross-tokenizer sample carried gradient (at least 1)
PROMPTS = 2  # train.prompts_per_step: groups a node publishes per step


def node_config(tmp: Path, name: str, model: Path | str, extra: list[str] = ()) -> NodeConfig:
    return NodeConfig.load(None, [
        f'node_dir="{tmp / name}"', f'model.name="{model}"', f'model.cache_dir="{tmp / "cache"}"',
        'model.device="cpu"', "generation.group_size=4", "generation.max_new_tokens=12",
        f"train.prompts_per_step={PROMPTS}", "train.learning_rate=1e-3", "train.total_steps=100",
        f'swarm.swarm_id="{SWARM}"', 'swarm.host_maddrs=["/ip4/127.0.0.1/tcp/0"]',
        "swarm.max_peer_fraction=1.0", "swarm.max_peer_groups_per_step=8", "swarm.max_groups_per_peer=8",
        "swarm.staleness_steps=1", "swarm.fetch_timeout_s=5.0", "checkpoint.every_steps=50",
        "metrics.ledger_every_steps=1", "task.levels=[1]", "task.size=50", *extra])


def trainable(node: Node) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in node.parts.policy.trainable_parameters()}


@pytest.fixture()
def two_tokenizers(tmp_path, warm_model):
    """A bootstrap DHT and two nodes on warm models with different tokenizers."""
    boot = start_transport(node_config(tmp_path, "bootstrap", "tiny-random:64x1").swarm, tmp_path / "bootstrap")
    peers = [f"swarm.initial_peers={list(boot.visible_maddrs)!r}".replace("'", '"')]
    nodes: list[Node] = []
    try:
        for name, base in (("bytes", "tiny-random:64x1:a"), ("bpe", "tiny-random:64x1:c")):
            cfg = node_config(tmp_path, name, warm_model(base), peers)
            transport = start_transport(cfg.swarm, cfg.node_dir)
            parts, start = build_parts(cfg, transport=transport)
            parts.close_hooks.append(transport.shutdown)
            nodes.append(Node(parts, start_step=start))
        yield nodes
    finally:
        for node in nodes:
            node._shutdown()
        boot.shutdown()


def test_nodes_with_different_tokenizers_train_on_each_other(two_tokenizers):
    a, c = two_tokenizers
    assert a.parts.policy.fingerprint != c.parts.policy.fingerprint
    assert a.parts.config.swarm.send_text == "auto" and a.parts.config.swarm.cross_tokenizer
    before = {n: trainable(n) for n in (a, c)}
    history: dict[Node, list[dict[str, float]]] = {a: [], c: []}

    def took_foreign(node: Node) -> bool:
        return any(m.get("crosstok_samples", 0) > 0 for m in history[node])

    rounds = 0
    while rounds < MAX_ROUNDS and not (took_foreign(a) and took_foreign(c)):
        for node in (a, c):
            history[node].append(node.run_step())
        rounds += 1
    summary = {n.parts.peer_id[:8]: [(m.get("text_groups"), m.get("peer_samples"), m.get("crosstok_samples"),
                                      m.get("dropped_tokenizer_mismatch", 0)) for m in history[n]] for n in (a, c)}
    assert took_foreign(a) and took_foreign(c), summary

    def foreign_gradient() -> int:
        return sum(r["crosstok_gradient"] for n in (a, c) for r in n.parts.ledger.rows())

    for k in range(MORE_ROUNDS):
        if k and foreign_gradient():
            break
        for node in (a, c):
            history[node].append(node.run_step())

    for node, other in ((a, c), (c, a)):
        ms = history[node]
        assert sum(m["peer_samples"] for m in ms) > 0
        assert sum(m.get("crosstok_samples", 0) for m in ms) > 0
        assert any(m["text_groups"] > 0 for m in ms), "auto send_text never sent text"
        # Only groups sent without text (before the sender saw another tokenizer, or withheld: some
        # completion had no faithful text) are dropped for their tokenizer; a group with text never.
        without_text = sum(PROMPTS - m["text_groups"] for m in history[other])
        assert sum(m.get("dropped_tokenizer_mismatch", 0) for m in ms) <= without_text, summary
        assert all(math.isfinite(v) for m in ms for v in m.values()), ms
        after = trainable(node)
        assert any(not torch.equal(before[node][k], after[k]) for k in after), "no parameter moved"
        # The peer ledger names the other's tokenizer and counts its cross-tokenizer samples.
        row = next(r for r in node.parts.ledger.rows() if r["peer_id"] == other.parts.peer_id)
        assert row["tokenizer"] == other.parts.policy.fingerprint
        assert row["tokenizer_same"] is False
        assert 0 < row["crosstok"] <= row["samples"]
        assert row["crosstok_gradient"] <= row["gradient"]
    # Warm models earn reward on some completions: peer samples of mixed rewards carry gradient.
    rows = [r for n in (a, c) for r in n.parts.ledger.rows()]
    print({r["peer_id"][:8]: (r["samples"], r["crosstok"], r["crosstok_gradient"], r["reward"]["mean"]) for r in rows})
    if any(0 < r["reward"]["mean"] < 1 for r in rows):
        assert foreign_gradient() > 0, rows
