"""What the soak runs: the training nodes, their shared settings, the light peers, the chaos schedule.

Training nodes are real `swarm-node join` processes. The tiny ones start from warm models
(`experiment.warmup`: the base tiny model trained on level-1 arithmetic until it answers some
problems right), on two tokenizers (variant a: bytes; c: a BPE trained in code) and two sizes
(64x2 and 128x2), full and LoRA; one embedded SmolLM2-135M node evaluates itself on held-out
problems; one slow node (a larger cold tiny model with many prompts a step, at low CPU priority)
generates for longer than peers keep groups fresh. All settings below are the node's defaults
except where the soak must fit 2 CPU cores (`SHARED`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SWARM_ID = "soak"
SYSTEM_PROMPT = "Answer in \\boxed{}."
WINDOW_S = 30.0  # swarm.window_seconds default
STALENESS = 4  # swarm.staleness_steps default
GROUP_SIZE = 8
MAX_NEW_TOKENS = 32
PROMPTS_PER_STEP = 4
MAX_PEER_GROUPS = 4
MAX_GROUPS_PER_PEER = 2
CHECKPOINT_EVERY = 10

# Settings every node shares (the swarm's and what fits 2 cores); per-node ones are in NodePlan.set.
SHARED: list[str] = [
    f"generation.group_size={GROUP_SIZE}",
    f"generation.max_new_tokens={MAX_NEW_TOKENS}",
    f"train.prompts_per_step={PROMPTS_PER_STEP}",
    "train.micro_batch_size=16",
    "train.total_steps=100000",  # the harness stops the nodes
    f"swarm.swarm_id=\"{SWARM_ID}\"",
    f"swarm.window_seconds={WINDOW_S}",
    f"swarm.staleness_steps={STALENESS}",
    "swarm.max_peer_fraction=0.5",
    f"swarm.max_peer_groups_per_step={MAX_PEER_GROUPS}",
    f"swarm.max_groups_per_peer={MAX_GROUPS_PER_PEER}",
    "swarm.fetch_timeout_s=10.0",
    f"checkpoint.every_steps={CHECKPOINT_EVERY}",
    "checkpoint.keep=2",
    "metrics.ledger_every_steps=1",  # the harness reads who took whose groups from the ledgers
    "model.device=\"cpu\"",
]
TINY: list[str] = [
    f"task.system_prompt=\"{SYSTEM_PROMPT.replace(chr(92), chr(92) * 2)}\"",
    "task.worked_example=false",
    "eval.problems=0",
    "model.compute_dtype=\"float32\"",
]


@dataclass(frozen=True)
class NodePlan:
    name: str
    warm: str | None  # a tiny-random base to warm up (None: `set` names the model)
    set: tuple[str, ...] = ()
    nice: int = 0
    role: str = "train"  # train | slow | smollm2 | late | cut


@dataclass
class SoakPlan:
    minutes: float
    nodes: list[NodePlan]
    light_processes: int
    light_per_process: int
    warm_steps: int = 300
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (minute, kind, node name)

    @property
    def light_peers(self) -> int:
        return self.light_processes * self.light_per_process

    @property
    def peers(self) -> int:
        return len(self.nodes) + self.light_peers


def _tiny(name: str, base: str, lora: bool, seed: int, role: str = "train") -> NodePlan:
    lr = "1e-3" if lora else "3e-4"
    extra = ("model.lora.enabled=true", "model.lora.rank=4") if lora else ()
    return NodePlan(name, base, (*TINY, f"train.learning_rate={lr}", f"train.seed={seed}", *extra), role=role)


def full_plan(minutes: float = 60.0, light: int = 36) -> SoakPlan:
    """12 training nodes (one late joiner among them) and `light` light peers; the chaos schedule
    spread over `minutes`."""
    nodes = [
        _tiny("a64-full", "tiny-random:64x2:a", False, 1),
        _tiny("a64-lora", "tiny-random:64x2:a", True, 2),
        _tiny("c64-full", "tiny-random:64x2:c", False, 3),
        _tiny("c64-lora", "tiny-random:64x2:c", True, 4),
        _tiny("a128-full", "tiny-random:128x2:a", False, 5),
        _tiny("a128-lora", "tiny-random:128x2:a", True, 6),
        _tiny("c128-full", "tiny-random:128x2:c", False, 7),
        _tiny("c128-lora", "tiny-random:128x2:c", True, 8, role="cut"),
        _tiny("a64-full-2", "tiny-random:64x2:a", False, 9),
        NodePlan("smollm2", None, ("eval.problems=32", "eval.every_steps=5", "train.learning_rate=1e-5",
                                   "train.micro_batch_size=8", "train.prompts_per_step=2", "train.seed=10"),
                 role="smollm2"),
        NodePlan("slow", None, (*TINY, "model.name=\"tiny-random:384x6:a\"", "train.prompts_per_step=24",
                                "train.learning_rate=1e-4", "train.seed=11"), nice=15, role="slow"),
        _tiny("late-c64", "tiny-random:64x2:c", False, 12, role="late"),
    ]
    per = 12
    plan = SoakPlan(minutes, nodes, light_processes=max(1, round(light / per)), light_per_process=per)
    plan.events = schedule(minutes, [n.name for n in nodes if n.role == "train"])
    return plan


def quick_plan(minutes: float = 5.0) -> SoakPlan:
    """8 peers for 5 minutes: 4 training nodes (one late) and 4 light peers, every event once
    (`minutes` is fixed: the schedule below is for 5)."""
    nodes = [
        _tiny("a64-full", "tiny-random:64x2:a", False, 1),
        _tiny("c64-lora", "tiny-random:64x2:c", True, 2, role="cut"),
        _tiny("a64-lora", "tiny-random:64x2:a", True, 3),
        _tiny("late-c64", "tiny-random:64x2:c", False, 4, role="late"),
    ]
    plan = SoakPlan(minutes, nodes, light_processes=1, light_per_process=4, warm_steps=150)
    # Events run one after another (a freeze and a cut last as long as they say): early enough that
    # every recovery is measured before the end.
    plan.events = [(1.0, "kill", "a64-full"), (1.4, "freeze", "a64-lora:1.5"), (2.3, "cut", "1"),
                   (3.3, "late_join", ""), (3.5, "prompt_set_switch", ""), (4.4, "status", "")]
    return plan


def schedule(minutes: float, killable: list[str]) -> list[tuple[float, str, str]]:
    """The chaos events (minute, kind, node): SIGKILL-and-restart every ~8 minutes over the
    killable nodes in turn (at least one), a freeze of 2.5 windows at 25% (`node:windows`), a two-minute network cut
    at 35% (a third of the run when shorter), the late joiner at 50%, the prompt-set switch at 65%,
    `status` reads at 75%."""
    events: list[tuple[float, str, str]] = []
    n_kills = max(1, int(minutes // 8))
    busy = {round(minutes * f, 1) for f in (0.25, 0.35, 0.5, 0.65, 0.75)}
    for k in range(n_kills):
        t = round(minutes * (k + 0.6) / n_kills, 1)
        while any(abs(t - b) < 1.0 for b in busy) and t < minutes - 1:
            t = round(t + 1.0, 1)
        events.append((t, "kill", killable[k % len(killable)]))
    freeze_target = killable[-1]
    cut_minutes = min(2.0, minutes / 3)
    events += [
        (round(minutes * 0.25, 1), "freeze", freeze_target),
        (round(minutes * 0.35, 1), "cut", f"{cut_minutes:g}"),
        (round(minutes * 0.5, 1), "late_join", ""),
        (round(minutes * 0.65, 1), "prompt_set_switch", ""),
        (round(minutes * 0.75, 1), "status", ""),
    ]
    return sorted(events)
