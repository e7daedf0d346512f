"""Whole nodes over real hivemind DHT processes on loopback, with tiny models.

Three heterogeneous nodes (two model sizes sharing a tokenizer, one of them LoRA) train on each
other's groups; a node with another tokenizer is skipped with that reason (and makes the others
send completion text); a misbehaving peer
writing raw records is counted and dropped while honest nodes keep training.
"""

from __future__ import annotations


import math
from pathlib import Path

import numpy as np
import pytest
import torch

from protocol import codec, keys
from protocol.messages import Completion, IndexEntry, RolloutGroup, RolloutIndex
from swarm_node.node.assemble import build_parts, start_transport
from swarm_node.config import NodeConfig
from swarm_node.node.loop import Node
from protocol.binding import select_prompts
from tests.fakes import hash_reward
from tests.unit.test_send_text import speak_unicode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]
SWARM = "itest-nodes"




def node_config(tmp: Path, name: str, model: str, extra: list[str] = ()) -> NodeConfig:
    return NodeConfig.load(None, [
        f'node_dir="{tmp / name}"', f'model.name="{model}"', f'model.cache_dir="{tmp / "cache"}"',
        'model.device="cpu"', "generation.group_size=4", "generation.max_new_tokens=12",
        "train.prompts_per_step=2", "train.learning_rate=1e-2", "train.total_steps=100",
        f'swarm.swarm_id="{SWARM}"', 'swarm.host_maddrs=["/ip4/127.0.0.1/tcp/0"]',
        "swarm.max_peer_fraction=0.75", "swarm.max_peer_groups_per_step=6", "swarm.max_groups_per_peer=4",
        "swarm.fetch_timeout_s=5.0", "checkpoint.every_steps=50", "task.levels=[1]", "task.size=50", *extra])


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    """A bootstrap DHT plus a factory of nodes joined to it; everything is shut down at the end."""
    tmp = tmp_path_factory.mktemp("swarm")
    boot_cfg = node_config(tmp, "bootstrap", "tiny-random:64x1")
    bootstrap = start_transport(boot_cfg.swarm, tmp / "bootstrap")
    nodes: list[Node] = []

    def make(name: str, model: str, extra: list[str] = ()) -> Node:
        cfg = node_config(tmp, name, model, [f"swarm.initial_peers={list(bootstrap.visible_maddrs)!r}".replace("'", '"'),
                                             *extra])
        transport = start_transport(cfg.swarm, cfg.node_dir)
        parts, start = build_parts(cfg, transport=transport)
        parts.close_hooks.append(transport.shutdown)
        parts.reward_fn = hash_reward
        node = Node(parts, start_step=start)
        nodes.append(node)
        return node

    yield bootstrap, make
    for node in nodes:
        node._shutdown()
    bootstrap.shutdown()


def trainable(node: Node) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in node.parts.policy.trainable_parameters()}


def test_three_heterogeneous_nodes_train_together(swarm):
    _, make = swarm
    a = make("full-small", "tiny-random:64x1:a")
    b = make("full-large", "tiny-random:128x2:a")
    c = make("lora-small", "tiny-random:64x1:a", ["model.lora.enabled=true", "model.lora.rank=4"])
    before = {n: trainable(n) for n in (a, b, c)}
    base_c = {k: v.detach().clone() for k, v in c.parts.policy.model.named_parameters() if "lora" not in k}
    history = {a: [], b: [], c: []}
    for _ in range(3):
        for node in (a, b, c):
            history[node].append(node.run_step())
    for node in (a, b, c):
        used = sum(m["peer_samples"] for m in history[node])
        assert used > 0, f"{node.parts.peer_id} trained on no peer samples"
        after = trainable(node)
        summary = [(m["loss"], m["grad_norm"], m["reward_mean"], m.get("optimizer_steps")) for m in history[node]]
        assert any(not torch.equal(before[node][k], after[k]) for k in after), (node.parts.peer_id, summary)
        assert all(math.isfinite(m["loss"]) for m in history[node])
    # LoRA node: only adapters moved.
    for k, v in c.parts.policy.model.named_parameters():
        if "lora" not in k:
            assert torch.equal(v, base_c[k])


def test_other_tokenizer_is_skipped_with_reason(swarm):
    """With swarm.cross_tokenizer off, another tokenizer's groups are dropped with that reason even
    when they carry text (tests/integration/test_cross_tokenizer.py has it on)."""
    _, make = swarm
    odd = make("other-tokenizer", "tiny-random:64x1:b")
    # Caps high enough that every fresh group in the swarm is fetched, the odd node's included.
    honest = make("honest-a", "tiny-random:64x1:a",
                  ["swarm.max_groups_per_peer=64", "swarm.max_peer_groups_per_step=256", "swarm.max_peer_fraction=1.0",
                   "swarm.cross_tokenizer=false"])
    odd.run_step()
    m = honest.run_step()
    assert m.get("dropped_tokenizer_mismatch", 0) >= 1 and m.get("crosstok_samples", 0) == 0
    # The peer ledger names the odd node's tokenizer as another one, and why its groups were dropped.
    row = next(r for r in honest.parts.ledger.rows() if r["peer_id"] == odd.parts.peer_id)
    assert row["tokenizer"] == odd.parts.policy.fingerprint and row["tokenizer_same"] is False
    assert row["dropped_by_reason"].get("tokenizer_mismatch", 0) >= 1 and row["crosstok"] == 0


def _valid_group(node: Node, sender: str, index: int, policy_version: int, now: float, **completion_kw) -> RolloutGroup:
    ps, policy = node.parts.prompt_set, node.parts.policy
    problem = ps.problems[index]
    from protocol.messages import PromptRef, SamplingParams

    tokens = completion_kw.pop("tokens", np.array([5, 6, 7], dtype=np.uint32))
    logprobs = completion_kw.pop("logprobs", np.array([-0.5, -1.0, -0.1], dtype=np.float32))
    return RolloutGroup(
        swarm_id=SWARM, sender=sender, model_id="evil", model_revision="", tokenizer_fingerprint=policy.fingerprint,
        policy_version=policy_version, created_at=completion_kw.pop("created_at", now),
        prompt=PromptRef(prompt_set_id=ps.id, index=index, sha256=completion_kw.pop("sha", problem.sha256)),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=12),
        completions=tuple(Completion(token_ids=tokens, logprobs=logprobs, finish_reason="length", claimed_reward=1.0)
                          for _ in range(4)))


def test_misbehaving_peer_is_counted_and_dropped(swarm, tmp_path):
    bootstrap, make = swarm
    honest = make("honest-b", "tiny-random:64x1:a",
                  ["swarm.max_groups_per_peer=32", "swarm.max_peer_groups_per_step=32", "swarm.max_peer_fraction=1.0"])
    victim = make("victim", "tiny-random:64x1:a")
    victim.run_step()
    # This test is about every bad kind being counted: a reputation that never shrinks the evil
    # peer's share (the default would stop fetching from it after its first faults).
    from swarm_node.swarm.admission import Reputation

    honest.parts.exchange.admission.reputation = Reputation(penalty=0.0, exclude_faults=float("inf"), trusted_after=0.0)
    cfg = node_config(tmp_path, "evil", "tiny-random:64x1", [f"swarm.initial_peers={list(bootstrap.visible_maddrs)!r}".replace("'", '"')])
    evil = start_transport(cfg.swarm, tmp_path / "evil")
    try:
        me, now = evil.peer_id, evil.dht_time()
        window = keys.window_of(now, honest.cfg.swarm.window_seconds)
        exp = now + 120
        vocab = len(honest.parts.policy.tokenizer)
        # Each group at its own policy version, on its own prompt of those the window assigns the evil
        # peer (prompt binding: the first n x slots_per_window of select_prompts(peer, window)).
        ps_size = len(honest.parts.prompt_set)
        assigned = select_prompts(me, window, 2 * honest.cfg.swarm.slots_per_window, ps_size, salt=SWARM)
        at = {v: assigned[v] for v in range(1, 12)}
        bad_groups = {
            "logprob_positive": _valid_group(honest, me, at[1], 1, now, logprobs=np.array([0.5, -1, -1], np.float32)),
            "logprob_nonfinite": _valid_group(honest, me, at[2], 2, now, logprobs=np.array([np.nan, -1, -1], np.float32)),
            "token_out_of_vocab": _valid_group(honest, me, at[3], 3, now, tokens=np.array([1, vocab + 5, 2], np.uint32)),
            # listed in this window's index with a time an hour before it: a lie (index_mismatch), never `stale`
            "index_mismatch": _valid_group(honest, me, at[4], 4, now, created_at=now - 3600),
            "unknown_prompt": _valid_group(honest, me, at[5], 5, now, sha="0" * 64),
        }
        entries, blobs = [], []

        def add(data: bytes, index: int, version: int, size: int | None = None, created_at: float = now) -> None:
            digest = codec.content_digest(data)
            blobs.append(data)
            entries.append(IndexEntry(chunk_digests=(digest,), size=len(data) if size is None else size,
                                      prompt_index=index, policy_version=version, created_at=created_at))

        for name, group in bad_groups.items():
            add(codec.encode(group), group.prompt.index, group.policy_version,
                created_at=group.created_at)
        add(b"\x93garbage that is not a message", at[6], 6)                   # malformed
        wrong_version = bytearray(codec.encode(_valid_group(honest, me, at[7], 7, now)))
        wrong_version[2] = 99
        add(bytes(wrong_version), at[7], 7)                                    # wrong protocol version
        add(codec.encode(_valid_group(honest, me, at[8], 8, now)), at[8], 8, size=1 << 30)  # oversized claim
        dup = codec.encode(_valid_group(honest, me, at[9], 9, now))
        add(dup, at[9], 9)
        add(dup + b"", at[9], 9)                                               # duplicate entry
        picked = next(i for i in range(ps_size) if i not in assigned)
        add(codec.encode(_valid_group(honest, me, picked, 10, now)), picked, 10)  # a cherry-picked prompt
        for data in blobs:
            evil.put_blob(data, exp)
        assert evil.store_owned(keys.rollout_index_key(SWARM, window),
                                codec.encode(RolloutIndex(sender=me, window=window, entries=tuple(entries))), exp)
        # Writing into the victim's subkey (its index for this window) must be refused.
        from hivemind.dht.crypto import RSASignatureValidator

        victim_transport = victim.parts.exchange.transport
        victim_subkey = RSASignatureValidator(victim_transport.identity.private_key).local_public_key
        forged_index = codec.encode(RolloutIndex(sender=victim.parts.peer_id, window=window, entries=tuple(entries)))
        forged = evil._dht.store(keys.rollout_index_key(SWARM, window), forged_index, exp, subkey=victim_subkey)
        seen: list = []
        original = honest.parts.trainer.step
        honest.parts.trainer.step = lambda samples: (seen.extend(samples), original(samples))[1]
        m = honest.run_step()
        found = honest.parts.exchange.transport.get_all(keys.rollout_index_key(SWARM, window), timeout=10)
    finally:
        evil.shutdown()
    dropped = {k[len("dropped_"):]: v for k, v in m.items() if k.startswith("dropped_")}
    for reason in ["logprob_positive", "logprob_nonfinite", "token_out_of_vocab", "index_mismatch", "unknown_prompt",
                   "decode_error", "bad_version", "oversized", "duplicate", "wrong_prompt"]:
        assert dropped.get(reason, 0) >= 1, (reason, dropped)
    assert math.isfinite(m["loss"]) and m["own_samples"] == 8
    # Only the one valid evil group (version 9, G=4 completions) may reach the optimizer.
    from_evil = [x for x in seen if x.source == me]
    assert len(from_evil) <= 4 and all(x.group_key.endswith(f":9:{at[9]}") for x in from_evil)
    assert forged is False
    victim_record = found.get(victim.parts.peer_id)
    if victim_record is not None:  # the victim published in this window: its index is its own
        assert all(e.policy_version == 0 for e in codec.decode(victim_record.value).entries)


def test_another_tokenizer_makes_nodes_send_text(swarm):
    """Last in the module: its groups would crowd the misbehaving peer's out of a capped gather."""
    _, make = swarm
    odd = make("other-tokenizer-2", "tiny-random:64x1:b")
    speaker = make("speaker", "tiny-random:64x1:a")
    speak_unicode(speaker)
    odd.run_step()
    assert speaker.run_step().get("dropped_tokenizer_mismatch", 0) >= 1
    # Having seen another tokenizer, the node sends completion text (swarm.send_text = auto), and
    # its status record names its tokenizer, through the real DHT and its record validators.
    assert speaker.run_step()["text_groups"] == 2
    odd.run_step()
    statuses = {s.peer_id: s.tokenizer_fingerprint for s in odd.parts.exchange.read_statuses(timeout=5.0)}
    assert statuses[speaker.parts.peer_id] == speaker.parts.policy.fingerprint
    assert speaker.parts.policy.fingerprint in odd.parts.exchange.tokenizers.others(odd.parts.dht_time())
