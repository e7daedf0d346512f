"""An experiment file: nodes, pairs of nodes, arms, seeds, steps and a held-out evaluation schedule.

    [experiment]  name, mode ("lockstep" | "swarm"), seeds, steps, peer_lag, cache_dir,
                  warmup_seed ("per_seed" | "fixed")
    [eval]        every, problems, batch_size, max_new_tokens, split ("heldout" | "validation"),
                  task = {TaskConfig fields}, ood_task = {TaskConfig fields}, ood_problems
    [defaults]    NodeConfig sections shared by every node of every arm (model, generation, train, task, ...)
    [[nodes]]     name, model, lora, learning_rate, temperature, levels, set = [dotted overrides],
                  warmup = {base, levels, ops, steps, learning_rate, ...} (optional: a cached supervised
                  warm-up of a base model, tiny-random or one `model.name` accepts; `model` is then filled in)
                  weak_skill (the operation the primary metric reads for this node)
    [[pairs]]     name, nodes = [node names], arms = [arm names] (default: every arm): one swarm each
                  (default: one pair of all nodes)
    [[arms]]      name, isolated = true (every node alone, on-policy GRPO) or correction ("none" | "vis" |
                  "tis") and filter ("on" | "off"), the swarm's `objective.correction` / `objective.filter`
                  (the old `variant = "isolated" | nois | ... | f-tis` is still read),
                  collaboration ("vertical" | "horizontal"), own_budget (isolated references only: x prompts
                  per step), set = [dotted overrides]
    [metrics]     primary ("weak_skill" | "overall" | "ood"), secondary, note: fixed before the grid runs

The grid is pairs x arms x seeds. Every arm gives each node the same own-generation budget
(steps x prompts_per_step x group_size), except an isolated reference that declares `own_budget`
(isolated-2x); an `isolated` arm trains every node alone with on-policy
GRPO. In a horizontal arm the n nodes of a pair answer the same n x prompts_per_step prompts per
step, G/n completions each (`generation.group_size` is the whole group G), so every group of G is the
union of the nodes' parts and the own budget is unchanged (`configs.horizontal_parts`).
`configs.node_config` turns (node, arm, seed) into the production `NodeConfig`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from swarm_node.config.objective import (
    VARIANT_SWITCHES, Correction, FilterSwitch, switches_of_variant, variant_name,
)
from swarm_node.config.toml_text import apply_override
from swarm_node.experiment.warmup import WarmupSpec

QUICK_WARMUP_STEPS = 20  # `--quick` checks that a file runs: its warm models need not be warm

DEFAULT_CACHE = Path("~/.cache/swarm-node/experiment")
MAX_PEER_LAG = 32


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExperimentSection(_Strict):
    name: str = Field("experiment", description="A name for the grid (used in titles).")
    mode: Literal["lockstep", "swarm"] = Field(
        "lockstep", description="lockstep: all nodes of an arm in one process over the in-memory transport; "
                                "swarm: real processes over the hivemind DHT (`swarm-node local`).")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, description="One run per seed.")
    steps: int = Field(20, ge=1, description="RL steps per node per run.")
    peer_lag: int = Field(
        0, ge=0, le=MAX_PEER_LAG,
        description="Lockstep: peers' records become visible k steps late (an arm's `peer_lag` overrides it). "
                    "The nodes' swarm.staleness_steps and swarm.record_ttl_s are raised where they would drop "
                    "or expire a group before it arrives (`configs.node_config`), so a lag measures F-TIS on "
                    "stale groups, not the node's staleness bound (docs/results/staleness.md: the sweep).")
    cache_dir: Path = Field(DEFAULT_CACHE, description="Where warm-up models and converted models are cached.")
    warmup_seed: Literal["per_seed", "fixed"] = Field(
        "per_seed",
        description=(
            "per_seed (default): a node's warm-up seed is its `warmup.seed` plus the experiment seed (batch order "
            "and torch seed; the warm-up questions stay the same), so every seed starts from its own warm model "
            "and intervals over seeds include the starting point; arms of one seed share it, so pairing holds. "
            "fixed: one warm model per node for every seed (the behaviour before; intervals then leave "
            "initialisation out)."
        ),
    )


class EvalSection(_Strict):
    every: int = Field(10, ge=1, description="Evaluate every K steps (and at step 0 and the last step).")
    problems: int = Field(64, ge=1, description="N held-out problems (greedy pass@1).")
    batch_size: int = Field(64, ge=1, description="Evaluation batch size.")
    max_new_tokens: int = Field(32, ge=1, description="Completion cap at evaluation.")
    split: Literal["heldout", "validation"] = Field(
        "heldout",
        description=(
            "Which split the grid evaluates (`tasks.heldout.split_of`, by a hash of the question): `heldout`, "
            "where claims are read; `validation`, a disjoint set (also disjoint from training and warm-up "
            "questions) for choosing settings (learning rate, g, a sandbox's mix) without reading the held-out set."
        ),
    )
    task: dict[str, Any] = Field(default_factory=lambda: {"name": "arithmetic", "seed": 1_000_003},
                                 description="TaskConfig of the evaluation set; problems whose question appears "
                                             "in any node's training set or warm-up data are removed.")
    ood_task: dict[str, Any] | None = Field(
        None, description="TaskConfig of an out-of-distribution evaluation set that no node trains or warms up on "
                          "(e.g. arithmetic level 2 when training on level 1), evaluated beside the held-out set "
                          "(`ood_accuracy` in evals.jsonl); same split and exclusions. None: no OOD set.")
    ood_problems: int = Field(256, ge=1, description="N problems of the OOD set.")


class NodeSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    model: str | None = None
    lora: bool | None = None
    learning_rate: float | None = Field(None, gt=0)
    temperature: float | None = Field(None, gt=0)
    levels: list[int] | None = None
    set: list[str] = Field(default_factory=list)
    warmup: dict[str, Any] | None = None
    weak_skill: Literal["add", "sub"] | None = Field(
        None, description="The skill (arithmetic operation: add | sub) this node is weak at by construction (its "
                          "warm-up's minority operation): the primary metric reads the held-out accuracy on it.")

    def warmup_spec(self, system_prompt: str | None, seed: int | None = None) -> WarmupSpec | None:
        """The node's warm-up; with `seed` (warmup_seed = "per_seed") its seed moves by the experiment
        seed and its questions stay those of its own seed (`data_seed`)."""
        if self.warmup is None:
            return None
        w = dict(self.warmup)
        for key in ("levels", "ops"):
            if key in w:
                w[key] = tuple(w[key])
        if "op_weights" in w:  # a TOML table {add = 0.9, sub = 0.1}: sorted pairs, so the cache name is stable
            w["op_weights"] = tuple(sorted((str(k), float(v)) for k, v in dict(w["op_weights"]).items()))
        w.setdefault("system_prompt", system_prompt)
        spec = WarmupSpec(**w)
        if seed is None:
            return spec
        return dataclasses.replace(spec, seed=spec.seed + seed, data_seed=spec.pool_seed)

    def warmup_for(self, spec: ExperimentSpec, seed: int) -> WarmupSpec | None:
        """The warm-up this node starts from in a run of experiment seed `seed`."""
        system_prompt = spec.defaults.get("task", {}).get("system_prompt")
        return self.warmup_spec(system_prompt, seed if spec.experiment.warmup_seed == "per_seed" else None)


class PairSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    nodes: list[str] = Field(min_length=1)
    arms: list[str] | None = Field(
        None, description="The arms run for this pair (default: every arm). A node's isolated arm is the same run "
                          "in every pair (same warm model, seeds and prompts), so a pair may leave `isolated` out and "
                          "the summary pairs its arms with the node's isolated run from another pair.")


class ArmSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    isolated: bool = Field(False, description="Every node trains alone (swarm off, no peer samples): on-policy "
                                               "GRPO, objective correction `none` and filter `off`.")
    correction: Correction | None = Field(None, description="`objective.correction` of a swarm arm (required "
                                                            "unless isolated).")
    filter: FilterSwitch | None = Field(None, description="`objective.filter` of a swarm arm (required unless "
                                                          "isolated).")
    collaboration: Literal["vertical", "horizontal"] = Field(
        "vertical", description="vertical: a node generates whole groups; horizontal: the nodes of a pair generate "
                                "G/n of each of n x prompts_per_step shared prompts per step (`horizontal_parts`).")
    set: list[str] = Field(default_factory=list)
    own_budget: int = Field(
        1, ge=1, le=8,
        description="Multiplier of each node's own-generation budget: `train.prompts_per_step` x this. Every arm "
                    "but a declared reference keeps 1; `isolated-2x` (isolated, own_budget = 2) is the "
                    "'just more samples' reference: twice the own prompts per step, no peers.")
    peer_lag: int | None = Field(
        None, ge=0, le=MAX_PEER_LAG,
        description="Lockstep: this arm's peer lag (peers' groups become visible k steps after they were made), "
                    "overriding experiment.peer_lag; a staleness sweep is one arm per lag. None: the experiment's.")

    @model_validator(mode="before")
    @classmethod
    def _legacy_variant(cls, data: Any) -> Any:
        """The old `variant` ("isolated", or a name `objective.variant` takes but grpo) as the new fields."""
        if not isinstance(data, dict) or "variant" not in data:
            return data
        where, name = f"arm {data.get('name')!r}: ", data["variant"]
        if name == "isolated":
            if data.get("isolated", True) is not True:
                raise ValueError(f"{where}variant='isolated' and isolated={data['isolated']!r} disagree: set only "
                                 "isolated (variant is its old name)")
            data = {**data, "isolated": True}
        elif not isinstance(name, str) or name not in VARIANT_SWITCHES or name == "grpo":
            raise ValueError(f"{where}variant={name!r} is not an arm's variant: set isolated = true, or correction "
                             "(none | vis | tis) and filter (on | off)")
        else:
            data = switches_of_variant(data, where)
        return {k: v for k, v in data.items() if k != "variant"}

    @model_validator(mode="after")
    def _check(self) -> ArmSpec:
        if self.isolated and (self.correction, self.filter) != (None, None):
            raise ValueError(f"arm {self.name!r} is isolated (on-policy GRPO, no peers): drop its correction and "
                             "filter, or set isolated = false")
        if not self.isolated and None in (self.correction, self.filter):
            raise ValueError(f"arm {self.name!r} needs correction (none | vis | tis) and filter (on | off), "
                             "or isolated = true")
        if self.peer_lag is not None and self.isolated:
            raise ValueError(f"arm {self.name!r} is isolated: it has no peers to lag (drop peer_lag)")
        if self.own_budget != 1 and not self.isolated:
            raise ValueError(f"arm {self.name!r}: own_budget != 1 is for isolated references only (a swarm arm "
                             "must spend the same own budget as isolated)")
        return self

    @property
    def variant_name(self) -> str:
        """`isolated`, or the paper's name of the arm's switches (`f-tis`, `nois`, ...)."""
        return "isolated" if self.isolated else variant_name(self.correction, self.filter)


class MetricsSection(_Strict):
    """The metrics claims are read from, fixed in the experiment file before the grid runs."""

    primary: Literal["weak_skill", "overall", "ood"] = Field(
        "overall",
        description="The primary metric, per node: the paired (by seed) difference of held-out AUC to the node's "
                    "isolated arm, on `weak_skill` (the node's `weak_skill` problems of the held-out set), `overall` "
                    "(the whole held-out set) or `ood` (the out-of-distribution set, `eval.ood_task`).")
    secondary: list[Literal["weak_skill", "overall", "ood"]] = Field(
        default_factory=list, description="Secondary metrics, reported after the primary one in the same form.")
    note: str = Field("", description="When and why the metrics were fixed (shown in the summary).")
    contrasts: list[str] = Field(
        default_factory=list,
        description="Paired differences between two swarm arms fixed with the metrics, each \"PAIR/ARM - PAIR/ARM\" "
                    "(e.g. \"cross-a/f-tis - same-bytes/f-tis\": the cost of crossing tokenizers): Δ AUC of the "
                    "primary and secondary metrics for every node the two pairs share, paired by seed.")

    @model_validator(mode="after")
    def _check_contrasts(self) -> MetricsSection:
        for c in self.contrasts:
            parse_contrast(c)
        return self


def parse_contrast(text: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """\"PAIR/ARM - PAIR/ARM\" as ((pair, arm), (pair, arm)); raises ValueError if malformed."""
    sides = [s.strip() for s in text.split(" - ")]
    parts = [s.split("/") for s in sides]
    if len(sides) != 2 or any(len(p) != 2 or not all(p) for p in parts):
        raise ValueError(f"contrast {text!r}: expected \"PAIR/ARM - PAIR/ARM\"")
    (a, b), (c, d) = parts
    return (a, b), (c, d)


class ExperimentSpec(_Strict):
    experiment: ExperimentSection = Field(default_factory=ExperimentSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    defaults: dict[str, Any] = Field(default_factory=dict)
    nodes: list[NodeSpec] = Field(min_length=1)
    pairs: list[PairSpec] = Field(default_factory=list)
    arms: list[ArmSpec] = Field(min_length=1)
    metrics: MetricsSection = Field(default_factory=MetricsSection)

    @model_validator(mode="after")
    def _check(self) -> ExperimentSpec:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be unique, got {names}")
        if not self.pairs:
            self.pairs = [PairSpec(name="all", nodes=names)]
        for pair in self.pairs:
            unknown = [n for n in pair.nodes if n not in names]
            if unknown:
                raise ValueError(f"pair {pair.name!r} names unknown nodes {unknown}; nodes are {names}")
        arm_names = [a.name for a in self.arms]
        for pair in self.pairs:
            unknown = [a for a in pair.arms or [] if a not in arm_names]
            if unknown:
                raise ValueError(f"pair {pair.name!r} names unknown arms {unknown}; arms are {arm_names}")
        if "weak_skill" in (self.metrics.primary, *self.metrics.secondary):
            missing = [n.name for n in self.nodes if n.weak_skill is None]
            if len(missing) == len(self.nodes):
                raise ValueError("metrics name weak_skill but no node has `weak_skill`")
        for group, items in (("pairs", self.pairs), ("arms", self.arms)):
            seen = [i.name for i in items]
            if len(set(seen)) != len(seen):
                raise ValueError(f"{group} names must be unique, got {seen}")
        for node in self.nodes:
            if node.model is None and node.warmup is None:
                raise ValueError(f"node {node.name!r} needs `model` or `warmup`")
        pair_names = {p.name: p for p in self.pairs}
        for text in self.metrics.contrasts:
            sides = parse_contrast(text)
            for pair, arm in sides:
                if pair not in pair_names or arm not in [a.name for a in self.pair_arms(pair_names[pair])]:
                    raise ValueError(f"contrast {text!r}: {pair}/{arm} is not an arm of a pair of this file")
            if not set(pair_names[sides[0][0]].nodes) & set(pair_names[sides[1][0]].nodes):
                raise ValueError(f"contrast {text!r}: the two pairs share no node")
        horizontal = [a.name for a in self.arms if a.collaboration == "horizontal" and not a.isolated
                      and self.peer_lag(a)]
        if horizontal and self.experiment.mode == "lockstep":
            raise ValueError(f"horizontal arms {horizontal} need experiment.peer_lag = 0: the parts of a shared "
                             "group must reach every node in the step they are generated")
        return self

    @classmethod
    def load(cls, path: Path, overrides: list[str] | None = None) -> ExperimentSpec:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        for item in overrides or []:
            apply_override(data, item)
        return cls.model_validate(data)

    def peer_lag(self, arm: ArmSpec) -> int:
        """The lockstep peer lag of `arm`: its own `peer_lag`, else the experiment's."""
        return self.experiment.peer_lag if arm.peer_lag is None else arm.peer_lag

    def node(self, name: str) -> NodeSpec:
        return next(n for n in self.nodes if n.name == name)

    def quick(self) -> ExperimentSpec:
        """A few steps, one seed, a small evaluation, warm-ups of QUICK_WARMUP_STEPS (cached apart
        from the grid's, their steps being part of their key): checks that a file runs end to end."""
        q = self.model_copy(deep=True)
        for node in q.nodes:
            if node.warmup is not None:
                node.warmup["steps"] = min(int(node.warmup.get("steps", QUICK_WARMUP_STEPS)), QUICK_WARMUP_STEPS)
        q.experiment.seeds = q.experiment.seeds[:1]
        q.experiment.steps = min(q.experiment.steps, 2)
        q.eval.every = q.experiment.steps
        q.eval.problems = min(q.eval.problems, 16)
        q.eval.ood_problems = min(q.eval.ood_problems, 16)
        return q

    def pair_arms(self, pair: PairSpec) -> list[ArmSpec]:
        return [a for a in self.arms if pair.arms is None or a.name in pair.arms]

    def runs(self) -> list[tuple[PairSpec, ArmSpec, int]]:
        """Pair by pair, seed by seed, every arm of the pair: a grid stopped early has all arms for some seeds."""
        return [(p, a, s) for p in self.pairs for s in self.experiment.seeds for a in self.pair_arms(p)]


def run_id(pair: PairSpec, arm: ArmSpec, seed: int) -> str:
    return f"{pair.name}/{arm.name}/seed{seed}"
