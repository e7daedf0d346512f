"""`objective`: the loss family of docs/method.md as two switches (the importance correction and the
sample filter) and its constants; a section of `NodeConfig` (`swarm_node.config`). The old single
names (`variant`: grpo, nois, ..., f-tis) are read into the two switches here."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LossVariant = Literal["grpo", "nois", "vis", "tis", "f-nois", "f-vis", "f-tis"]
Correction = Literal["none", "vis", "tis"]
FilterSwitch = Literal["on", "off"]
VARIANT_SWITCHES: dict[str, tuple[Correction, FilterSwitch]] = {  # old single names -> (correction, filter)
    "grpo": ("none", "off"), "nois": ("none", "off"), "vis": ("vis", "off"), "tis": ("tis", "off"),
    "f-nois": ("none", "on"), "f-vis": ("vis", "on"), "f-tis": ("tis", "on"),
}


def variant_name(correction: Correction, filter: FilterSwitch) -> str:
    """The paper's name of two switches: `f-` when filtered, then nois, vis or tis (`f-tis`: tis, on)."""
    return ("f-" if filter == "on" else "") + ("nois" if correction == "none" else correction)


def switches_of_variant(data: dict[str, Any], where: str) -> dict[str, Any]:
    """`data` with its `variant` (an old single name, kept) read into `correction` and `filter`; a switch
    set beside it must agree, else one-line ValueError. `where` prefixes names ("objective.")."""
    name = data.get("variant")
    if not isinstance(name, str) or name not in VARIANT_SWITCHES:  # absent or unknown: the field's check
        return data
    data = dict(data)
    for key, want in zip(("correction", "filter"), VARIANT_SWITCHES[name]):
        if data.setdefault(key, want) != want:
            c, f = VARIANT_SWITCHES[name]
            raise ValueError(f"{where}variant={name!r} means correction={c!r}, filter={f!r}, but {where}{key}="
                             f"{data[key]!r} is set: set only {where}correction and {where}filter (variant is "
                             "their old single name)")
    return data



class ObjectiveConfig(BaseModel):
    """The loss family (docs/method.md) as two switches: the importance correction (none, vis, tis) and
    the sample filter (on, off); the paper's NoIS, VIS, TIS, F-NoIS, F-VIS, F-TIS are their six pairs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    correction: Correction = Field(
        "tis", description="Importance correction of samples from another policy pi_gen: `none` treats them as "
        "on-policy (NoIS); `vis`: pi_theta/pi_gen under the PPO clip; `tis` (default): the PPO term times "
        "min(pi_theta_old/pi_gen, C), detached. On own on-policy samples all three are GRPO.")
    filter: FilterSwitch = Field(
        "on", description="`on` (default, the f-* variants): drop samples of `filter_scope` by `filter_rule` "
        "(A <= 0, KL > g) after the group advantages; `off`: keep every sample.")
    variant: LossVariant | None = Field(
        None, description="Old single name of both switches, still accepted (a switch set beside it must agree): "
        "nois, vis, tis = that correction, filter off; f-nois, f-vis, f-tis = filter on; `grpo` = none, off on a node "
        "without peer samples (the isolated baseline: refused unless swarm.enabled=false or "
        "swarm.max_peer_fraction=0, which is its new form with correction='none', filter='off').")
    truncation_c: float = Field(2.0, gt=0, description="C: importance weights are truncated at C (TIS).")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO clip epsilon for pi_theta/pi_theta_old (and VIS).")
    kl_estimator: Literal["k3_gen", "k3_theta"] = Field(
        "k3_gen",
        description=(
            "Per-token KL estimate on the sampled tokens, which come from pi_gen (`swarm_node.method.kl`). `k3_gen` "
            "(default): r - 1 - log r, r = pi_theta/pi_gen, unbiased for KL(pi_gen||pi_theta) on pi_gen's samples "
            "(summed over a completion: for its sequence-level KL); the default because it is the form that "
            "estimates a KL on peers' samples. `k3_theta`: e^d - d - 1, d = log pi_gen - log pi_theta (the authors' "
            "code): a KL(pi_theta||pi_gen) estimate only on pi_theta's samples, biased and heavy-tailed on peers'."
        ),
    )
    kl_threshold: float = Field(
        50.0, gt=0,
        description=(
            "g: samples in the filter scope with a per-sample KL > g meet the KL condition; read in `kl_reduction`'s "
            "unit. 50 is the paper's g, read as a completion's KL in nats (`sum` of `k3_gen`): about 0.1-0.25 "
            "nats/token for GSM8K-length answers, and rarely reached by completions of a few tokens; choose g from "
            "the reported `kl_peer_*` distribution. The authors' code: k3_theta, `mean`, g = 5, filter_rule `and`."
        ),
    )
    kl_reduction: Literal["sum", "mean"] = Field(
        "sum",
        description="How the per-token KL is reduced over valid completion tokens (`sum`: the completion's KL; "
                    "`mean`: nats per token); g is read in this unit.",
    )
    filter_rule: Literal["or", "and"] = Field(
        "or",
        description=(
            "Which samples of the filter scope the f-* variants drop: `or` (the paper's text, default): A <= 0 or "
            "KL > g; `and` (the authors' published code): only A <= 0 and KL > g, so a close peer's "
            "negative-advantage samples still teach what not to do."
        ),
    )
    filter_scope: Literal["peers", "all"] = Field("peers", description="Filter peers' samples only, or own too.")
    scale_by_std: bool = Field(True, description="Advantage = (r-mean)/(std+eps); false: r-mean only.")
    advantage_eps: float = Field(1e-4, gt=0, description="eps in the advantage denominator.")
    normalization: Literal["sequence", "token"] = Field(
        "sequence", description="`sequence`: 1/G sum_i 1/|a_i| sum_t (paper); `token`: mean over all tokens."
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_variant(cls, data: Any) -> Any:
        return switches_of_variant(data, "objective.") if isinstance(data, dict) else data

    @property
    def variant_name(self) -> str:
        """For metrics and reports: `variant` when set (`grpo` stays `grpo`), else the switches' name."""
        return self.variant or variant_name(self.correction, self.filter)
