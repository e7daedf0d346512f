"""`swarm.spot_check`: logprob spot-checks of peers' groups against a reference model (swarm_node/peers/spotcheck.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_TOLERANCE = 0.25
"""Default `swarm.spot_check.tolerance`: 3.4x the worst honest group measured by
benchmarks/spotcheck_tolerance.py (0.073, SmolLM2-135M sampled by HF in float32, rechecked in
bfloat16; vLLM-sampled groups at most 0.069; 0 false positives in 6,912 honest checks, HF and vLLM,
float32 and bfloat16); swarm_node/peers/spotcheck.py has the full table."""


class SpotCheckConfig(BaseModel):
    """Recompute a few of a peer group's generator logprobs when this node holds the exact model the
    group declares (model id, revision, adapter digest), and drop the group (`logprob_mismatch`) when
    they disagree beyond `tolerance`."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(True, description="Spot-check peer groups whose declared model this node holds (an entry "
                                            "of reference_models, or its own model while untrained).")
    reference_models: list[str] = Field(
        default_factory=list,
        description="Models loaded frozen (on CPU) as references: names as model.name takes them (a local "
                    "directory, a hub id, smollm2-135m, a tiny-random spec). A peer group declaring one of them "
                    "(same id, revision, no adapter) is checked.")
    reference_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype the reference models (on the CPU) are stored and compute in; this node's own "
                               "model checks in its model.compute_dtype.")
    positions: int = Field(8, ge=1, le=256, description="Token positions checked per group (spread over "
                                                        "`completions` completions drawn at random).")
    completions: int = Field(2, ge=1, le=64, description="Completions of a group the positions are drawn from.")
    tolerance: float = Field(
        DEFAULT_TOLERANCE, gt=0, le=1e6,
        description="A group is dropped when the median over its checked positions of exp(|declared - recomputed|) - 1 "
                    "exceeds this (logprobs at the group's declared temperature).")
    max_tokens_per_step: int = Field(
        8192, ge=0, description="Tokens the reference forward passes may cover per step (prompt + completion prefix "
                                "of each checked completion); groups beyond it are not checked (`over_budget`).")
    budget_s: float = Field(5.0, ge=0, description="Seconds of spot-checking per step; groups beyond it are not "
                                                   "checked (`over_budget`).")
