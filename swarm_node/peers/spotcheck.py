"""Logprob spot-checks: recompute a few of a peer group's generator logprobs with the model it declares.

The threat (docs/method.md, hostile peers): a peer may forge the generator logprobs it sends, e.g. every
token at the floor so that every importance weight min(pi_theta / pi_gen, C) sits at C, or 0
("certainty"). Structure checks cannot see that; a model can.

The rule. A group declares the exact weights that generated it: (model_id, model_revision,
adapter_digest) (`Policy.declared_revision`: a node whose weights moved declares base+"+trained";
a LoRA node declares its current adapter's digest). When this node holds a *reference* equal to
that declaration, with the group's tokenizer fingerprint, it recomputes the logprobs of
`positions` random token positions spread over `completions` random completions of the group, at
the group's DECLARED temperature (log softmax(logits / T), the quantity samplers report and
`scoring.token_logprobs` computes), with the prompt rendered by the reference's tokenizer under
this node's task template, and drops the group when

    median over checked positions of exp(|declared - recomputed|) - 1  >  tolerance

(`logprob_mismatch`; a fault of the sender: its reputation share falls, the peer ledger counts it,
and the group joins the reject list). References: the operator's `swarm.spot_check.reference_models`
(loaded frozen), and this node's own model while it is untrained (no optimizer step, no checkpoint
loaded). A group whose declared model this node does not hold is not checked (`unchecked`); one
beyond the step's budget (`max_tokens_per_step` forwarded tokens, `budget_s` seconds) neither
(`over_budget`). Positions come from the receiver's random stream, so a sender cannot tell which
tokens will be checked: forging fewer than half of its tokens passes the median, forging most fails.

Tolerance, measured (benchmarks/spotcheck_tolerance.py on this 2-core CPU: honest groups of 4
completions x <= 32 tokens at temperature 1 on arithmetic prompts, sampled by this node's generator
(`--backend hf`: HFGenerator; `--backend vllm`: VLLMGenerator, vLLM 0.32 on CPU) with the model in
float32 and in bfloat16, each group rechecked by HF in float32 and in bfloat16, 8 positions of 2
completions; per-group median exp(|delta|) - 1; "checks" = group x scoring dtype; results in
docs/results/hostile_peers.md):

    sampler  model                                   checks  fp32 -> fp32   worst with bfloat16   p99
    HF       tiny-random:128x2 (random)                 640  5e-7           0.0077                0.0071
    HF       tiny-random:256x2-tied:b (random)          640  1e-6           0.0133                0.0099
    HF       the same two, warmed 120 steps (x2 seeds) 2560  6e-7           0.0010                4e-5
    HF       SmolLM2-135M (embedded; 2 seeds)           256  1.3e-5         0.0727                0.064
    vLLM     tiny-random:128x2 (random)                 640  7e-7           0.0082                0.0075
    vLLM     tiny-random:256x2-tied:b (random)          640  1.2e-6         0.0107                0.0096
    vLLM     the same two, warmed 120 steps            1280  6e-7           0.0015                4e-5
    vLLM     SmolLM2-135M (embedded)                    256  1.7e-5         0.0687                0.064

0 of 6,912 honest checks exceeded 0.25 (no false positive: below 1 in 1,000 with margin). The
default tolerance 0.25 is 3.4x the worst honest group measured (SmolLM2, HF float32 sampling
rechecked in bfloat16; vLLM's worst, bfloat16 rechecked in bfloat16, is 0.069). Forged copies of
the same groups at the same positions: logprobs lowered by log C = log 2 (every weight at C, the
most F-TIS allows; exp(|delta|) - 1 = 1) and by log 1.5 (0.5) were caught in every check, and so
was the floor (-50). An undetected forger gains at most a factor 1.25 on its weights. Declaring 0
("certainty") is caught only where the model is not nearly certain: 35 of 80 HF and 137 of 256 vLLM
SmolLM2 checks, all 1,280 vLLM checks of the random tiny models, 0 of the warmed tiny models'
(their tokens are nearly certain, so 0 is nearly the truth); such a forgery lowers the importance
weight (pi_theta / 1 <= 1), it does not amplify. bfloat16 on GPUs and larger models may stray
further: measure with this benchmark before tightening the tolerance.

Precision and memory. A reference scores in its own compute dtype (`Reference.compute_dtype`): this
node's model in the node's (bf16 autocast on a GPU), a listed reference in
`swarm.spot_check.reference_dtype` (weights stored and computed in it, on the CPU). Logprobs are float32
from logits read a chunk of rows at a time (`scoring.sampled_logprobs`), so a check of r completion
prefixes of T tokens holds [r, T, V] logits in the compute dtype and no float32 copy of them; the
node's memory plan counts that pass (`memory.spot_check_parts`, in the generation phase it overlaps).
The tolerance table above was measured with references scoring in float32 (the "bfloat16" rechecks
loaded bf16 compute over float32 weights and were scored without autocast): a bf16 reference's own
noise is to be re-measured with benchmarks/spotcheck_tolerance.py before the tolerance is tightened.

What bounds a liar whose model this node cannot load: only the F-TIS weight cap C and the KL /
advantage filter (objective.py). A forged logprob moves a token's weight min(pi_theta / pi_gen, C)
anywhere in [0, C], never above, so a forged group's gradient weight per token is at most C times
that of an on-policy token with the same advantage (benchmarks/spotcheck_influence.py measures
it: a forger at theta - log C reaches exactly C = 2 times an honest sample's gradient weight; at 0,
0.26 times; at the floor, 0: the KL filter drops it).
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from protocol.messages import RolloutGroup
from swarm_node import metric_names as m
from swarm_node.tasks.base import Problem

LOGPROB_MISMATCH = "logprob_mismatch"
CHECKED, UNCHECKED, OVER_BUDGET = "checked", "unchecked", "over_budget"


def mismatch(declared: Sequence[float], recomputed: Sequence[float]) -> float:
    """median_i exp(|declared_i - recomputed_i|) - 1 (0 for no positions); inf for a non-finite pair."""
    d = np.asarray(declared, dtype=np.float64) - np.asarray(recomputed, dtype=np.float64)
    if d.size == 0:
        return 0.0
    if not np.all(np.isfinite(d)):
        return math.inf
    return float(np.median(np.expm1(np.minimum(np.abs(d), 700.0))))


def sample_positions(lengths: Sequence[int], prompt_len: int, positions: int, completions: int,
                     max_tokens: int, rng: random.Random) -> dict[int, list[int]]:
    """Which token positions to check: {completion index: sorted positions}. Up to `completions`
    completions drawn at random, `positions` positions in all dealt among them as evenly as their
    lengths allow, each completion's drawn without replacement. Checking completion i costs a
    forward pass over prompt_len + max(position) + 1 tokens; completions are added while the total
    stays within `max_tokens` ({} when not even one fits)."""
    chosen = rng.sample(range(len(lengths)), min(completions, len(lengths)))
    chosen = [i for i in chosen if lengths[i] > 0]
    want = {i: 0 for i in chosen}
    left = positions
    while left > 0 and any(want[i] < lengths[i] for i in chosen):
        for i in chosen:
            if left > 0 and want[i] < lengths[i]:
                want[i] += 1
                left -= 1
    out: dict[int, list[int]] = {}
    spent = 0
    for i in chosen:
        if want[i] == 0:
            continue
        picked = sorted(rng.sample(range(lengths[i]), want[i]))
        cost = prompt_len + picked[-1] + 1
        if spent + cost > max_tokens:
            continue
        out[i] = picked
        spent += cost
    return out


def check_cost(picked: dict[int, list[int]], prompt_len: int) -> int:
    return sum(prompt_len + p[-1] + 1 for p in picked.values())


@dataclass
class Reference:
    """A model this node can recompute logprobs with, and the declaration it stands for."""

    model: Any
    tokenizer: Any
    model_id: str
    revision: str
    adapter_digest: str
    fingerprint: str
    active: Callable[[], bool] = lambda: True  # the own model is a reference only while untrained
    compute_dtype: torch.dtype = torch.float32  # the dtype its forward passes run in (autocast; float32: none)

    def matches(self, group: RolloutGroup) -> bool:
        return (self.active() and group.model_id == self.model_id and group.model_revision == self.revision
                and group.adapter_digest == self.adapter_digest and group.tokenizer_fingerprint == self.fingerprint)


def own_reference(policy: Any) -> Reference:
    """This node's model as a reference while it is untrained (`Policy.trained`)."""
    return Reference(model=policy.model, tokenizer=policy.tokenizer, model_id=policy.model_id,
                     revision=policy.revision or "", adapter_digest=policy.adapter_digest,
                     fingerprint=policy.fingerprint, active=lambda: not policy.trained,
                     compute_dtype=policy.compute_dtype)


def policy_reference(policy: Any) -> Reference:
    """A loaded, frozen model (`load_policy` of a `reference_models` entry) as a reference."""
    for p in policy.model.parameters():
        p.requires_grad_(False)
    policy.model.eval()
    return Reference(model=policy.model, tokenizer=policy.tokenizer, model_id=policy.model_id,
                     revision=policy.revision or "", adapter_digest="", fingerprint=policy.fingerprint,
                     compute_dtype=policy.compute_dtype)


Render = Callable[[Any, Problem], Sequence[int]]  # (tokenizer, problem) -> prompt token ids


@dataclass
class SpotSession:
    """One step's spot-checks within its budgets; `counts` and `seconds` feed the step's metrics."""

    references: Sequence[Reference]
    render: Render
    positions: int
    completions: int
    tolerance: float
    max_tokens: int
    budget_s: float
    rng: random.Random
    counts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    tokens: int = 0
    mismatches: list[float] = field(default_factory=list)  # per checked group

    def check(self, group: RolloutGroup, problem: Problem) -> str | None:
        """LOGPROB_MISMATCH to drop `group`, else None (checked and passed, or not checked)."""
        ref = next((r for r in self.references if r.matches(group)), None)
        if ref is None:
            self.counts[UNCHECKED] += 1
            return None
        if self.seconds >= self.budget_s:
            self.counts[OVER_BUDGET] += 1
            return None
        start = time.monotonic()
        prompt = list(self.render(ref.tokenizer, problem))
        lengths = [int(c.token_ids.shape[0]) for c in group.completions]
        picked = sample_positions(lengths, len(prompt), self.positions, self.completions,
                                  self.max_tokens - self.tokens, self.rng)
        if not picked:
            self.counts[OVER_BUDGET] += 1
            return None
        value = group_mismatch(ref.model, prompt, group, picked, ref.compute_dtype)
        self.tokens += check_cost(picked, len(prompt))
        self.seconds += time.monotonic() - start
        self.counts[CHECKED] += 1
        self.mismatches.append(value)
        if value > self.tolerance:
            self.counts[LOGPROB_MISMATCH] += 1
            return LOGPROB_MISMATCH
        return None

    def metrics(self) -> dict[str, float]:
        return {m.SPOT_CHECKED: float(self.counts[CHECKED]), m.SPOT_UNCHECKED: float(self.counts[UNCHECKED]),
                m.SPOT_OVER_BUDGET: float(self.counts[OVER_BUDGET]),
                m.SPOT_MISMATCH: float(self.counts[LOGPROB_MISMATCH]), m.SPOT_SECONDS: self.seconds,
                m.SPOT_TOKENS: float(self.tokens)}


def recompute(model: Any, prompt: Sequence[int], group: RolloutGroup, picked: dict[int, list[int]],
              compute_dtype: torch.dtype = torch.float32) -> tuple[list[float], list[float]]:
    """(declared, recomputed) logprobs at the picked positions, at the group's declared temperature,
    the model running under autocast to `compute_dtype` (float32: none)."""
    from swarm_node.policy.scoring import token_logprobs

    order = sorted(picked)
    prefixes = [np.asarray(group.completions[i].token_ids[: picked[i][-1] + 1], dtype=np.int64) for i in order]
    with torch.no_grad():
        scored = token_logprobs(model, [prompt] * len(order), [p.tolist() for p in prefixes],
                                temperature=group.sampling.temperature, micro_batch_size=len(order),
                                compute_dtype=compute_dtype)
    declared, ours = [], []
    for i, lp in zip(order, scored, strict=True):
        values = lp.float().cpu().numpy()
        for t in picked[i]:
            declared.append(float(group.completions[i].logprobs[t]))
            ours.append(float(values[t]))
    return declared, ours


def group_mismatch(model: Any, prompt: Sequence[int], group: RolloutGroup, picked: dict[int, list[int]],
                   compute_dtype: torch.dtype = torch.float32) -> float:
    return mismatch(*recompute(model, prompt, group, picked, compute_dtype))


class SpotChecker:
    """The node's references and settings (`swarm.spot_check`); `session(seed)` starts a step's checks."""

    def __init__(self, references: Sequence[Reference], render: Render, cfg: Any) -> None:
        self.references, self.render, self.cfg = list(references), render, cfg

    def session(self, seed: int) -> SpotSession:
        c = self.cfg
        return SpotSession(references=self.references, render=self.render, positions=c.positions,
                           completions=c.completions, tolerance=c.tolerance, max_tokens=c.max_tokens_per_step,
                           budget_s=c.budget_s, rng=random.Random(seed))


def build_spot_checker(cfg: Any, policy: Any, render: Render) -> SpotChecker | None:
    """The node's checker from its config (`swarm.spot_check`): the listed references, loaded frozen on
    CPU in `reference_dtype`, and its own model (while untrained). None when spot-checks are off."""
    sc = cfg.swarm.spot_check
    if not sc.enabled:
        return None
    from swarm_node.policy.models import load_policy

    refs = [own_reference(policy)]
    for name in sc.reference_models:
        refs.append(policy_reference(load_policy(reference_model_config(cfg.model, name, sc.reference_dtype))))
    return SpotChecker(refs, render, sc)


def reference_model_config(model: Any, name: str, dtype: str) -> Any:
    """A listed reference's ModelConfig, validated: `name` on the CPU, no LoRA, its weights stored and
    computed in `dtype` (frozen: no optimizer updates them), the node's cache."""
    from swarm_node.config import ModelConfig

    data = model.model_dump()
    data.update(name=name, revision=None, device="cpu", compute_dtype=dtype, param_dtype=dtype,
                lora={**data["lora"], "enabled": False})
    return ModelConfig.model_validate(data)
