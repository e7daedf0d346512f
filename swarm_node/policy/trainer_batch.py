"""A training step's samples as a batch: advantages, weights, micro-batches, and what to report.

`prepare_batch(samples, ...)` is the first part of `Trainer.step` (`swarm_node.policy.trainer`):
  1. groups samples by `group_key` and computes advantages over the *full* groups
     (`objective.group_advantages`), and per-sample weights over the whole batch
     (`objective.sample_weights`), so micro-batch losses add up to the batch loss;
  2. leaves out the samples that cannot carry gradient (`objective.carries_gradient`: advantage
     exactly 0, as in a group whose completions all got the same reward, or a peer sample with
     A <= 0 under `filter_rule = "or"`); the update is exactly the same without them, and they are counted
     in the stats (`objective.unscored_stats`); peer samples among them with tokens and finite
     logprobs are returned as micro-batches for the trainer's no-grad diagnosis pass;
  3. splits the rest into micro-batches of one prompt each (the scorer runs that prompt once), or
     with `train.pack_prompts` packs several prompts' pieces into each (fewer passes),
     longest completions first.
The helpers after it read a batch for the trainer: the chunk ids a micro-batch passes to the
objective (`micro_batch_chunk_ids`), per peer sample what the objective measured of it
(`peer_sample_stats`), the batch composition metrics (`sample_metrics`) and the scored lengths
(`scored_length_metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from swarm_node import metric_names as m
from swarm_node.config import ObjectiveConfig
from swarm_node.method.objective import ObjectiveStats, carries_gradient, group_advantages, sample_weights, unscored_stats
from swarm_node.policy.scoring import pad_right
from swarm_node.policy.types import SampleStat, TrainSample


@dataclass
class Batch:
    """A step's samples as tensors on the model's device (B samples)."""

    prompts: list[Tensor]  # B x [P_i] long
    completions: list[Tensor]  # B x [T_i] long
    generator_logprobs: list[Tensor]  # B x [T_i] float32
    chunk_ids: list[Tensor | None]  # B x [T_i] long, None for a sample in this node's tokens
    advantages: Tensor  # [B]
    weights: Tensor  # [B] float64
    is_peer: Tensor  # [B] bool
    micro_batches: list[list[int]]  # samples to score: one prompt per micro-batch (unless packed), longest first
    unscored: ObjectiveStats  # the samples left out (they carry no gradient)
    stats_order: list[int]  # the sample of each per-sample statistic of an epoch's stats, in order


def prepare_batch(samples: Sequence[TrainSample], ocfg: ObjectiveConfig, micro_batch_size: int,
                  device: torch.device, pack_prompts: bool = False) -> tuple[Batch, list[list[int]]]:
    """(the batch, micro-batches of the peer samples without gradient to diagnose); see the module
    docstring. `batch.unscored` does not yet hold the diagnosed samples' statistics."""
    keys: dict[str, int] = {}
    group_ids = torch.tensor([keys.setdefault(s.group_key, len(keys)) for s in samples], dtype=torch.long,
                             device=device)  # [B]
    rewards = torch.tensor([float(s.reward) for s in samples], dtype=torch.float32, device=device)
    lengths = torch.tensor([len(s.completion_ids) for s in samples], dtype=torch.long, device=device)
    for s in samples:
        if len(s.generator_logprobs) != len(s.completion_ids):
            raise ValueError(f"sample from {s.source!r}: {len(s.completion_ids)} tokens but "
                             f"{len(s.generator_logprobs)} generator logprobs")
        if s.chunk_ids is not None and len(s.chunk_ids) != len(s.completion_ids):
            raise ValueError(f"sample from {s.source!r}: {len(s.completion_ids)} tokens but "
                             f"{len(s.chunk_ids)} chunk ids")
    advantages = group_advantages(rewards, group_ids, scale_by_std=ocfg.scale_by_std, eps=ocfg.advantage_eps)
    is_peer = torch.tensor([bool(s.is_peer) for s in samples], dtype=torch.bool, device=device)
    carries = carries_gradient(advantages, is_peer, ocfg).tolist()
    scored = [i for i in range(len(samples)) if carries[i] and len(samples[i].completion_ids) > 0]
    scored_set = set(scored)
    # Peer samples without gradient still get a no-grad pass, for the KL and weight statistics.
    diagnosed = [i for i in range(len(samples)) if samples[i].is_peer and i not in scored_set
                 and len(samples[i].completion_ids) > 0 and np.isfinite(samples[i].generator_logprobs).all()]
    rest = sorted(set(range(len(samples))) - scored_set - set(diagnosed))
    left_out = torch.tensor(rest, dtype=torch.long, device=device)
    diagnosed_mbs = _micro_batches(samples, diagnosed, micro_batch_size, pack_prompts)
    scored_mbs = _micro_batches(samples, scored, micro_batch_size, pack_prompts)
    batch = Batch(
        prompts=[torch.as_tensor(s.prompt_ids, dtype=torch.long, device=device) for s in samples],
        completions=[torch.as_tensor(s.completion_ids, dtype=torch.long, device=device) for s in samples],
        generator_logprobs=[torch.as_tensor(s.generator_logprobs, dtype=torch.float32, device=device)
                            for s in samples],
        chunk_ids=[None if s.chunk_ids is None else torch.as_tensor(s.chunk_ids, dtype=torch.long, device=device)
                   for s in samples],
        advantages=advantages,
        weights=sample_weights(group_ids, lengths, ocfg.normalization),
        is_peer=is_peer,
        micro_batches=scored_mbs,
        unscored=unscored_stats(advantages[left_out], is_peer[left_out], ocfg),
        stats_order=[i for mb in (*diagnosed_mbs, *scored_mbs) for i in mb],
    )
    return batch, diagnosed_mbs


def peer_sample_stats(samples: Sequence[TrainSample], batch: Batch, stats: ObjectiveStats) -> list[SampleStat]:
    """Per peer sample of the step: what the objective measured of it (an epoch's `stats` follow
    `batch.stats_order`). A peer sample left unscored (no tokens: the protocol refuses non-finite
    logprobs) has no KL or weight and carries no gradient."""
    measured = dict(zip(batch.stats_order, stats.per_sample(), strict=True))
    out = []
    for i, s in enumerate(samples):
        if s.is_peer:
            kl, rho, filtered, gradient, bad_adv, bad_kl = measured.get(i, (None, None, False, False, False, False))
            out.append(SampleStat(s.source, float(s.reward), kl, rho, filtered, gradient,
                                  crosstok=s.chunk_ids is not None,
                                  filtered_advantage=filtered and bad_adv, filtered_kl=filtered and bad_kl))
    return out


def micro_batch_chunk_ids(batch: Batch, idx: list[int]) -> Tensor | None:
    """[b, T] chunk ids of a micro-batch (positions for rows in own tokens, 0 on padding), or None
    when every row is in this node's tokens (the objective's per-token path)."""
    rows = [batch.chunk_ids[i] for i in idx]
    if all(r is None for r in rows):
        return None
    positions = [torch.arange(len(batch.completions[i]), device=batch.completions[i].device) for i in idx]
    return pad_right([r if r is not None else p for r, p in zip(rows, positions, strict=True)], 0, torch.long)


def _micro_batches(samples: Sequence[TrainSample], indices: Sequence[int], size: int,
                   pack: bool = False) -> list[list[int]]:
    """Split `indices` into micro-batches of at most `size` samples of one prompt each (so the
    scorer runs each prompt once per micro-batch), longest completions first within a prompt.

    `pack`: then fill each micro-batch with whole pieces of further prompts while they fit (in
    order), so a step of many small groups takes a few large passes instead of one per prompt."""
    by_prompt: dict[bytes, list[int]] = {}
    for i in indices:
        by_prompt.setdefault(np.asarray(samples[i].prompt_ids, dtype=np.int64).tobytes(), []).append(i)
    out: list[list[int]] = []
    for members in by_prompt.values():
        members.sort(key=lambda i: -len(samples[i].completion_ids))
        out.extend(members[start : start + size] for start in range(0, len(members), size))
    if not pack:
        return out
    packed: list[list[int]] = []
    for piece in out:
        if packed and len(packed[-1]) + len(piece) <= size:
            packed[-1].extend(piece)
        else:
            packed.append(list(piece))
    return packed


def sample_metrics(samples: Sequence[TrainSample]) -> dict[str, float]:
    """Batch composition in `swarm_node.metric_names` terms (the objective reports the peer counts)."""
    own = [s for s in samples if not s.is_peer]
    crosstok = [s.chunk_ids for s in samples if s.chunk_ids is not None and len(s.chunk_ids)]
    chunks = sum(int(c[-1]) + 1 for c in crosstok)  # chunk ids run 0..n-1 in order
    return {
        m.REWARD_MEAN: sum(s.reward for s in own) / len(own) if own else 0.0,
        m.REWARD_MEAN_ALL: sum(s.reward for s in samples) / len(samples) if samples else 0.0,
        m.OWN_SAMPLES: float(len(own)),
        m.COMPLETION_TOKENS: float(sum(len(s.completion_ids) for s in samples)),
        m.CROSSTOK_SAMPLES: float(len(crosstok)),
        m.CROSSTOK_TOKENS_PER_CHUNK: sum(len(c) for c in crosstok) / chunks if chunks else 0.0,
    }


def scored_length_metrics(batch: Batch) -> dict[str, float]:
    """The longest prompt and completion among the samples scored with gradient: what sizes the
    step's activations and logits (the memory plan's lengths; `doctor` reads them back)."""
    scored = [i for mb in batch.micro_batches for i in mb]
    return {m.LONGEST_PROMPT: float(max((len(batch.prompts[i]) for i in scored), default=0)),
            m.LONGEST_COMPLETION: float(max((len(batch.completions[i]) for i in scored), default=0))}
