"""One training step over own plus peer samples: advantages, F-TIS objective, AdamW update.

`Trainer.step(samples)`:
  1. builds the batch (`swarm_node.policy.trainer_batch.prepare_batch`): advantages over the *full*
     groups and per-sample weights over the whole batch, so micro-batch losses add up to the batch loss;
  2. leaves out the samples that cannot carry gradient (`prepare_batch` says which); the update is
     exactly the same without them, and they are counted in the stats and in `skipped_samples`;
  3. for each of `epochs_per_batch` epochs: scores every micro-batch of the rest (one prompt per
     micro-batch, so the scorer runs that prompt once; several with `train.pack_prompts`) with gradient
     (`scoring.token_logprobs`), calls `objective.objective_loss`, backpropagates, and after the
     last micro-batch clips the gradient norm and takes one AdamW step. Samples generated with
     another tokenizer carry `chunk_ids` (`swarm_node.method.crosstok`); a micro-batch holding one passes
     every row's chunk ids to the objective (positions for the others), which then takes the
     ratios against pi_gen per chunk.
     `step_start_logprobs` (pi_theta_old, read by the KL filter, the importance weight and the PPO
     ratio) are the first epoch's trainer logprobs, detached: the weights have not moved yet at
     that point, so no separate no-grad pass is needed. Scoring runs in eval mode (dropout off),
     so weights and KL are those of the policy; a model with dropout (e.g. `lora.dropout > 0`)
     keeps it for the gradient pass and gets pi_theta_old from an extra no-grad eval pass;
     peer samples left out in step 2 get a no-grad pass too (`_diagnose`), so the KL and weight
     statistics cover every peer sample; after the step, `peer_sample_stats` holds per peer
     sample its sender, reward, KL, mean importance weight, and whether it was filtered or
     carried gradient (the node's peer ledger attributes them per sender);
  4. advances the learning-rate schedule (constant / linear / cosine after linear warmup); the
     schedule is a pure function of `step_count`, which is all its state.
Temperature: every sample, own or peer, is scored at this node's own sampling temperature. That is
the policy the node trains (its own samples come from it), so it is the importance weight's target;
a peer's logprobs are under the peer's declared temperature, the distribution its tokens were drawn
from (the weight's behaviour side). Scoring a peer sample at the peer's temperature instead would
train another policy on it and the weight would no longer correct for the sampling mismatch. The
declared temperature is what a check of the sender's logprobs against its own model must use; a
receiver refuses temperatures outside its supported range (`protocol.validate`).

Precision: the trained weights and AdamW's state are float32 (`swarm_node.policy.precision`); the
forward and backward passes run under autocast to the policy's compute dtype (bf16 on GPUs), so an
update of about the learning rate is not rounded away. `train.gradient_checkpointing` recomputes each
decoder layer's activations in the backward pass (`enable_gradient_checkpointing`); the gradient pass
then scores whole sequences (no prompt cache: checkpointed layers drop caches).

An epoch in which no token can carry gradient (all samples filtered or of zero advantage) skips the
optimizer step but the step still counts.

Non-finite numerics never reach the weights. The objective clamps every log-ratio, so finite
inputs give finite losses; should a loss or the gradient norm still be non-finite, the epoch's
gradient is discarded, the step's peer samples are dropped and the remaining epochs run on own
samples only (metrics `nonfinite_dropped_samples`, `nonfinite_senders`; the blamed peer samples
are left in `Trainer.poisoned` for the node to remember). Non-finite numerics from own samples
alone are a bug of this node and raise FloatingPointError.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from swarm_node import metric_names as m
from swarm_node.config import ObjectiveConfig, TrainConfig
from swarm_node.method.objective import ObjectiveInputs, ObjectiveStats, objective_loss
from swarm_node.policy.models import Policy
from swarm_node.policy.scoring import padded_batch, token_logprobs
from swarm_node.policy.trainer_batch import (
    Batch,
    micro_batch_chunk_ids,
    peer_sample_stats,
    prepare_batch,
    sample_metrics,
    scored_length_metrics,
)
from swarm_node.policy.types import SampleStat, TrainSample


log = logging.getLogger(__name__)


class _NonFinite(Exception):
    """A non-finite loss (`culprit_indices`: the micro-batch's samples) or gradient norm (None)."""

    def __init__(self, message: str, culprit_indices: list[int] | None) -> None:
        super().__init__(message)
        self.culprit_indices = culprit_indices
        self.culprits: list[TrainSample] | None = None
        self.epoch = 0
        self.optimizer_steps = 0
        self.first: dict[str, float] = {}


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of `cfg.learning_rate` at optimizer step `step` (0-based)."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.schedule == "linear":
        return 1.0 - progress
    if cfg.schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {cfg.schedule!r}")


class Trainer:
    """Owns the optimizer of `policy`'s trainable parameters and applies `step` to sample batches."""

    def __init__(self, policy: Policy, train_cfg: TrainConfig, objective_cfg: ObjectiveConfig,
                 temperature: float) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.policy = policy
        self.cfg = train_cfg
        self.objective_cfg = objective_cfg
        self.temperature = float(temperature)
        self.params = [p for _, p in policy.trainable_parameters()]
        if not self.params:
            raise ValueError(f"model {policy.model_id!r} has no trainable parameters")
        self.optimizer = torch.optim.AdamW(self.params, lr=train_cfg.learning_rate, betas=tuple(train_cfg.betas),
                                           weight_decay=train_cfg.weight_decay)
        self.step_count = 0
        self.poisoned: list[TrainSample] = []  # peer samples blamed for the last step's non-finite numerics
        self.peer_sample_stats: list[SampleStat] = []  # per peer sample trained on in the last step
        self.dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in policy.model.modules())
        self.checkpoint_layers: list[torch.nn.Module] = []
        if train_cfg.gradient_checkpointing:
            self.checkpoint_layers = enable_gradient_checkpointing(policy.model)

    def _score(self, prompts: list[Any], completions: list[Any], grad: bool) -> list[Tensor]:
        """Trainer logprobs of one micro-batch under the compute dtype; `grad`: the gradient pass,
        where checkpointed layers recompute their activations in the backward pass."""
        with checkpointing(self.checkpoint_layers if grad else []):
            return token_logprobs(self.policy.model, prompts, completions, self.temperature, len(prompts),
                                  compute_dtype=self.policy.compute_dtype,
                                  share_prompts=not (grad and self.checkpoint_layers))

    @property
    def lr(self) -> float:
        """The learning rate the next step uses."""
        return self.cfg.learning_rate * lr_factor(self.step_count, self.cfg)

    def step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One optimisation step on `samples`; returns flat metrics (see module docstring).

        `self.poisoned` lists, after the call, the peer samples blamed for a non-finite step."""
        lr = self.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.poisoned, self.peer_sample_stats = [], []
        dropped: list[TrainSample] = []
        model = self.policy.model
        was_training = model.training
        try:
            try:
                stats, first, optimizer_steps, batch = self._epochs(samples, 0)
                self.peer_sample_stats = peer_sample_stats(samples, batch, stats)
            except _NonFinite as bad:
                dropped, self.poisoned = self._blame(samples, bad)
                own = [s for s in samples if not s.is_peer]
                try:
                    stats, first, steps_after, batch = self._epochs(own, bad.epoch)
                except _NonFinite as again:
                    raise FloatingPointError(f"{again} on own samples only") from None
                optimizer_steps = bad.optimizer_steps + steps_after
                first = bad.first if bad.epoch > 0 else first
        finally:
            model.train(was_training)
        self.step_count += 1
        return m.merge(stats.to_dict(), sample_metrics(samples), scored_length_metrics(batch), first, {
            m.LR: lr,
            m.OPTIMIZER_STEPS: float(optimizer_steps),
            m.SKIPPED: float(optimizer_steps == 0),
            m.SKIPPED_SAMPLES: float(len(samples) - len(dropped) - sum(len(mb) for mb in batch.micro_batches)),
            m.NONFINITE_DROPPED_SAMPLES: float(len(dropped)),
            m.NONFINITE_SENDERS: float(len({s.source for s in self.poisoned})),
        })

    def _epochs(self, samples: Sequence[TrainSample], start_epoch: int
                ) -> tuple[ObjectiveStats, dict[str, float], int, Batch]:
        """Epochs `start_epoch..epochs_per_batch-1` over `samples`: (last epoch's stats, first
        epoch's loss and gradient norm, optimizer steps taken, the batch). Raises `_NonFinite`."""
        first = {m.LOSS: 0.0, m.GRAD_NORM: 0.0}
        stats = ObjectiveStats.empty()
        optimizer_steps = 0
        self.policy.model.train(self.dropout)  # eval mode unless dropout is configured (see _accumulate)
        batch = self._prepare(samples)
        step_start: list[Tensor] = [torch.zeros(0)] * len(samples)
        for epoch in range(start_epoch, self.cfg.epochs_per_batch if samples else 0):
            try:
                loss, stats = self._accumulate(batch, step_start, first_epoch=epoch == start_epoch)
                grad_norm, stepped = self._apply(stats)
            except _NonFinite as bad:
                self.optimizer.zero_grad(set_to_none=True)
                bad.epoch, bad.optimizer_steps, bad.first = epoch, optimizer_steps, first
                bad.culprits = [samples[i] for i in bad.culprit_indices] if bad.culprit_indices is not None else None
                raise
            optimizer_steps += int(stepped)
            if epoch == start_epoch:
                first = {m.LOSS: loss, m.GRAD_NORM: grad_norm}
        return stats, first, optimizer_steps, batch

    def _blame(self, samples: Sequence[TrainSample], bad: _NonFinite) -> tuple[list[TrainSample], list[TrainSample]]:
        """(peer samples dropped from the step, peer samples blamed) for a non-finite step.

        The micro-batch whose loss was non-finite is to blame; a non-finite gradient norm cannot be
        traced to a micro-batch, so every peer sample is. Only own samples to blame: our own bug."""
        peers = [s for s in samples if s.is_peer]
        blamed = [s for s in (bad.culprits if bad.culprits is not None else peers) if s.is_peer]
        if not blamed:
            raise FloatingPointError(str(bad))
        log.warning("step %d: %s; dropped the step's %d peer samples, blamed senders: %s", self.step_count, bad,
                    len(peers), ", ".join(sorted({s.source for s in blamed})))
        return peers, blamed

    def _prepare(self, samples: Sequence[TrainSample]) -> Batch:
        batch, diagnosed = prepare_batch(samples, self.objective_cfg, self.cfg.micro_batch_size, self.policy.device,
                                         self.cfg.pack_prompts)
        batch.unscored.merge(self._diagnose(batch, diagnosed))
        return batch

    @torch.no_grad()
    def _diagnose(self, batch: Batch, micro_batches: list[list[int]]) -> ObjectiveStats:
        """Statistics (KL, importance weights, filters) of samples that carry no gradient, from a
        no-grad pass in eval mode at the step's starting weights, so that the KL distribution users
        read to choose g covers every peer sample, not only those with a positive advantage."""
        stats = ObjectiveStats.empty()
        model = self.policy.model
        was_training = model.training
        model.eval()
        try:
            for idx in micro_batches:
                logprobs, mask = padded_batch(self._score([batch.prompts[i] for i in idx],
                                                          [batch.completions[i] for i in idx], grad=False))
                index = torch.tensor(idx, device=logprobs.device)
                inputs = ObjectiveInputs(
                    trainer_logprobs=logprobs, step_start_logprobs=logprobs,
                    generator_logprobs=padded_batch([batch.generator_logprobs[i] for i in idx])[0], mask=mask,
                    advantages=batch.advantages[index], is_peer=batch.is_peer[index],
                    sample_weights=batch.weights[index], chunk_ids=micro_batch_chunk_ids(batch, idx))
                stats.merge(objective_loss(inputs, self.objective_cfg)[1])
        finally:
            model.train(was_training)
        return stats

    def _accumulate(self, batch: Batch, step_start: list[Tensor], first_epoch: bool) -> tuple[float, ObjectiveStats]:
        """Forward + backward over every micro-batch; gradients accumulate in `.grad`.

        In the first epoch, fills `step_start` with the detached trainer logprobs."""
        self.optimizer.zero_grad(set_to_none=True)
        stats = ObjectiveStats.empty().merge(batch.unscored)
        total = 0.0
        for idx in batch.micro_batches:
            scored = self._score([batch.prompts[i] for i in idx], [batch.completions[i] for i in idx], grad=True)
            if first_epoch:
                reference = self._reference_logprobs(batch, idx) if self.dropout else scored
                for i, lp in zip(idx, reference, strict=True):
                    step_start[i] = lp.detach()
            trainer_lp, mask = padded_batch(scored)  # [b, T], [b, T]
            index = torch.tensor(idx, device=trainer_lp.device)
            inputs = ObjectiveInputs(
                trainer_logprobs=trainer_lp,
                step_start_logprobs=padded_batch([step_start[i] for i in idx])[0],
                generator_logprobs=padded_batch([batch.generator_logprobs[i] for i in idx])[0],
                mask=mask,
                advantages=batch.advantages[index],
                is_peer=batch.is_peer[index],
                sample_weights=batch.weights[index],
                chunk_ids=micro_batch_chunk_ids(batch, idx),
            )
            loss, mb_stats = objective_loss(inputs, self.objective_cfg)
            if not torch.isfinite(loss):
                raise _NonFinite(f"non-finite loss {float(loss.detach())} at step {self.step_count}",
                                 _culprit_rows(inputs, idx))
            if loss.requires_grad:
                loss.backward()
            stats.merge(mb_stats)
            total += float(loss.detach())
        return total, stats

    @torch.no_grad()
    def _reference_logprobs(self, batch: Batch, idx: list[int]) -> list[Tensor]:
        """pi_theta_old for a model with dropout: a no-grad pass in eval mode, so importance weights
        and the KL are read from the policy itself, not from one dropout sample of it."""
        model = self.policy.model
        model.eval()
        try:
            return self._score([batch.prompts[i] for i in idx], [batch.completions[i] for i in idx], grad=False)
        finally:
            model.train()

    def _apply(self, stats: ObjectiveStats) -> tuple[float, bool]:
        """Clip and step; skipped (returns (0, False)) when no token carried gradient."""
        if float(stats.n_active_tokens) == 0:
            self.optimizer.zero_grad(set_to_none=True)
            return 0.0, False
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        if not torch.isfinite(norm):
            raise _NonFinite(f"non-finite gradient norm {float(norm)} at step {self.step_count}", None)
        self.optimizer.step()
        self.policy.weights_changed()  # rollout groups now declare trained weights (Policy.declared_revision)
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm), True

    # ---- persistence ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Optimizer state and step count (the schedule is a function of the step count)."""
        return {"optimizer": self.optimizer.state_dict(), "step_count": self.step_count,
                "schedule": {"step_count": self.step_count}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_count = int(state["step_count"])


def enable_gradient_checkpointing(model: Any) -> list[torch.nn.Module]:
    """Turn on transformers' (non-reentrant) gradient checkpointing; returns the checkpointed layers.

    transformers checkpoints a layer only while that layer is in training mode, and the trainer scores
    in eval mode (no dropout: the importance weights and the KL are the policy's). `checkpointing`
    sets just those layers' own `training` flags around the gradient pass, so their submodules
    (attention, dropout) stay in eval mode."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no layers that support gradient checkpointing: "
                         "set train.gradient_checkpointing=false")
    return layers


@contextlib.contextmanager
def checkpointing(layers: list[torch.nn.Module]) -> Iterator[None]:
    """Mark `layers` (and only them, not their submodules) as training while the block runs."""
    before = [layer.training for layer in layers]
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer, was in zip(layers, before, strict=True):
            layer.training = was


def _culprit_rows(inputs: ObjectiveInputs, idx: list[int]) -> list[int]:
    """The samples of a micro-batch with a non-finite loss that hold non-finite inputs at valid
    positions (all of the micro-batch when none does: the loss cannot then be traced further)."""
    finite = (torch.isfinite(inputs.generator_logprobs) & torch.isfinite(inputs.trainer_logprobs.detach())
              & torch.isfinite(inputs.step_start_logprobs)) | ~inputs.mask  # [b, T]
    bad = (~finite.all(dim=1)).tolist()
    rows = [i for i, b in zip(idx, bad, strict=True) if b]
    return rows or list(idx)
