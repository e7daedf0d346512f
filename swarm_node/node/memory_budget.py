"""A node's memory plan from its config, fitted to this machine before the model loads.

`node_plan(cfg, shape, ...)` is `policy.memory.step_plan` at the node's settings plus the
generator's share: the HF backend's key/value cache of a generation batch (it generates with the
trainer's module), a vLLM engine's share on a GPU (`generation.vllm_gpu_memory_utilization` of
the GPU; only while generating with `generation.vllm_sleep`), or on a CPU its own copy of the
weights and `generation.vllm_kv_cache_gib`. A micro-batch holds one prompt's rows (the largest
group a node trains on) unless `train.pack_prompts`; the prompt is the prompt set's longest when
its tokenizer is at hand without loading the model, else `generation.max_prompt_tokens`.

`fit(cfg, shape, budget)` decides the micro-batch and checkpointing a node runs with:
`train.micro_batch_size = 0` picks the largest micro-batch that fits; a set one is kept when it
fits. Gradient checkpointing is switched on when nothing fits without it and something fits with
it. When nothing fits, the node is refused with one line naming what would fit: LoRA, a smaller
token cap or G, a smaller model (`swarm-node doctor` shows the plan part by part).

On a GPU the plan also holds what the device keeps beyond torch's live tensors (`policy.memory`:
the allocator's reserve, the CUDA context, a vLLM engine's CUDA graph pools), the spot-check's
forward pass with the node's own model (`memory.spot_check_parts`), and the compute dtype the GPU
supports (`Budget.bf16`: `torch.cuda.is_bf16_supported()`; V100 and T4 compute in float32); `fit`
keeps FIT_MARGIN of the GPU free on top (`Budget.usable`). A model not in the local cache is planned
from its config.json alone (`preflight.fetch_model_shape`, before the weights download).

The plan is a worst case: every completion at `generation.max_new_tokens`. Once a node has trained,
`observed_lengths(node_dir)` reads the longest prompt and completion its steps logged, and the same
plan at those lengths is what the node is expected to use (`doctor` shows both).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from swarm_node import metric_names as m
from swarm_node.config import ModelConfig, NodeConfig
from swarm_node.util.errors import InputError
from swarm_node.util.jsonl import read_rows
from swarm_node.policy import memory
from swarm_node.policy.memory import GIB, MemoryPlan, ModelShape, Part, Precision, gib

log = logging.getLogger(__name__)

EMBEDDED_NAME = "smollm2-135m"
# SmolLM2-135M-Instruct's config.json (the embedded default; its converted copy says the same).
EMBEDDED_SHAPE = ModelShape(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, intermediate=1536,
                            vocab=49152, tied=True)
TINY_TOKENIZER_SIZES = {"a": 3 + 256, "b": 256 + 100 + 3, "c": 512}  # policy.tiny's variants
# The share of a GPU's memory `fit` leaves unplanned: for what the plan's stated CUDA constants
# (policy.memory) miss until a GPU run measures them, and other processes on the device. On a CPU the
# plan is calibrated against peak RSS (0.89-1.07) and no margin is kept.
FIT_MARGIN = 0.10


# ---- the model's shape, without loading it ------------------------------------------------------


def _hub_cached_dir(name: str, revision: str | None) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(name, "config.json", revision=revision)
    return Path(found).parent if isinstance(found, str) else None


def model_dir(name: str, revision: str | None = None) -> Path | None:
    """The local directory of a model name (a local path, or the hub cache's snapshot), if any."""
    path = Path(name).expanduser()
    return path if path.is_dir() else _hub_cached_dir(name, revision)


def model_shape_of_name(name: str, revision: str | None = None) -> ModelShape | None:
    """The shape of a tiny spec, the embedded default, a local directory or a cached hub model."""
    if name.startswith("tiny-random:"):
        from swarm_node.policy import tiny

        spec = tiny.parse_tiny_spec(name)
        return ModelShape(hidden=spec.hidden, layers=spec.layers, heads=spec.heads, kv_heads=spec.kv_heads,
                          head_dim=tiny.HEAD_DIM,
                          intermediate=2 * spec.hidden, vocab=max(TINY_TOKENIZER_SIZES[spec.variant], spec.vocab),
                          tied=spec.tied)
    if name == EMBEDDED_NAME:
        return EMBEDDED_SHAPE
    where = model_dir(name, revision)
    try:
        config = json.loads((where / "config.json").read_text()) if where is not None else None
    except (OSError, ValueError):
        return None
    return ModelShape.from_config(config) if isinstance(config, dict) else None


# ---- the node's plan ----------------------------------------------------------------------------


def precision_of(model: ModelConfig, device: str, bf16: bool = True) -> Precision:
    """Bytes per element as `policy.precision` resolves the dtypes (`bf16`: the GPU computes in it)."""
    compute = model.compute_dtype
    if compute == "auto":
        compute = "bfloat16" if device == "cuda" and bf16 else "float32"
    param = model.param_dtype
    if param == "auto":
        param = compute if model.lora.enabled else "float32"
    stored = memory.DTYPE_BYTES[param]
    if model.lora.enabled:  # peft keeps the adapter (and so its gradients and moments) in float32
        return Precision(param=4, base=stored, compute=memory.DTYPE_BYTES[compute])
    return Precision(param=stored, base=stored, compute=memory.DTYPE_BYTES[compute])


def model_step_plan(model: ModelConfig, device: str, *, micro_batch: int, prompt_tokens: int, completion_tokens: int,
                    gradient_checkpointing: bool = False, baseline: bool = True) -> MemoryPlan:
    """One training step's plan (`memory.step_plan`) for the model `model` names, at its precision on
    `device`: what a benchmark compares with a measured step (peak RSS: `.total`; CUDA: `.allocated`)."""
    shape = model_shape_of_name(model.name, model.revision)
    if shape is None:
        raise ValueError(f"the shape of {model.name} is unknown (not a tiny spec, the embedded model or a local one)")
    lora = memory.Lora(model.lora.rank, tuple(model.lora.target_modules)) if model.lora.enabled else None
    return memory.step_plan(shape, device="cuda" if device.startswith("cuda") else "cpu", micro_batch=micro_batch,
                            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                            precision=precision_of(model, "cuda" if device.startswith("cuda") else "cpu"), lora=lora,
                            gradient_checkpointing=gradient_checkpointing, baseline=baseline)


def max_rows(cfg: NodeConfig) -> int:
    """The most rows a micro-batch can hold: the largest group trained on (one prompt per
    micro-batch), or a whole step's own rows with `train.pack_prompts`."""
    g = max(cfg.generation.group_size, cfg.swarm.max_peer_group_size or 0)
    return max(g, cfg.train.prompts_per_step * cfg.generation.group_size) if cfg.train.pack_prompts else g


def generator_kind(cfg: NodeConfig) -> Literal["hf", "vllm"]:
    """The backend `auto` would try (vLLM when installed)."""
    if cfg.generation.backend == "auto":
        return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    return "vllm" if cfg.generation.backend == "vllm" else "hf"


def _generator_parts(cfg: NodeConfig, shape: ModelShape, device: str, p: Precision, prompt: int,
                     gpu_total: int | None, kind: str, completion: int) -> list[Part]:
    g = cfg.generation
    if kind == "vllm":
        if device == "cuda":
            share = int(g.vllm_gpu_memory_utilization * (gpu_total or 0))
            graphs = [] if g.vllm_enforce_eager else [
                Part("CUDA graphs", "static", memory.VLLM_CUDA_GRAPH_BYTES, "vLLM's graph pools, beside its share")]
            return [Part("generator", "generate" if g.vllm_sleep else "static", share,
                         f"vLLM: {g.vllm_gpu_memory_utilization:.0%} of the GPU"), *graphs]
        gen_bytes = memory.DTYPE_BYTES["float32" if g.dtype == "auto" else g.dtype]
        return [Part("generator", "static", shape.params * gen_bytes + g.vllm_kv_cache_gib * GIB,
                     f"vLLM: its weights + {g.vllm_kv_cache_gib} GiB KV cache")]
    rows = min(g.batch_size, cfg.train.prompts_per_step * g.group_size)
    new = completion
    if cfg.eval.problems:
        rows, new = max(rows, cfg.eval.batch_size), max(new, cfg.eval.max_new_tokens or 0)
    return memory.generation_parts(shape, p, device="cuda" if device == "cuda" else "cpu",
                                   stored=p.param if not cfg.model.lora.enabled else p.base, rows=rows,
                                   prompt_tokens=prompt, new_tokens=new)


def _spot_check_parts(cfg: NodeConfig, shape: ModelShape, device: str, p: Precision, prompt: int,
                      completion: int) -> list[Part]:
    """The spot-check's pass with the node's own model (its listed references run on the CPU)."""
    sc = cfg.swarm.spot_check
    if not (cfg.swarm.enabled and sc.enabled):
        return []
    rows = min(sc.completions, max(cfg.generation.group_size, cfg.swarm.max_peer_group_size or 0))
    return memory.spot_check_parts(shape, p, device="cuda" if device == "cuda" else "cpu",
                                   stored=p.param if not cfg.model.lora.enabled else p.base, rows=rows,
                                   prompt_tokens=prompt, completion_tokens=completion)


def node_plan(cfg: NodeConfig, shape: ModelShape, device: str, *, micro_batch: int | None = None,
              checkpointing: bool | None = None, prompt_tokens: int | None = None, gpu_total: int | None = None,
              generator: str | None = None, completion_tokens: int | None = None, bf16: bool = True) -> MemoryPlan:
    """The plan of a node with `cfg` (micro-batch and checkpointing as configured unless given), with
    every completion at `completion_tokens` (unset: generation.max_new_tokens, the worst case);
    `bf16`: the GPU computes in bfloat16 (`Budget.bf16`)."""
    m = micro_batch if micro_batch is not None else cfg.train.micro_batch_size or max_rows(cfg)
    ckpt = cfg.train.gradient_checkpointing if checkpointing is None else checkpointing
    prompt = prompt_tokens or cfg.generation.max_prompt_tokens
    new = completion_tokens or cfg.generation.max_new_tokens
    p = precision_of(cfg.model, device, bf16)
    kind = generator or generator_kind(cfg)
    lora = memory.Lora(cfg.model.lora.rank, tuple(cfg.model.lora.target_modules)) if cfg.model.lora.enabled else None
    plan = memory.step_plan(shape, device="cuda" if device == "cuda" else "cpu", micro_batch=min(m, max_rows(cfg)),
                            prompt_tokens=prompt, completion_tokens=new, precision=p,
                            lora=lora, gradient_checkpointing=ckpt)
    plan = replace(plan, micro_batch=m)
    return memory.with_parts(plan, _generator_parts(cfg, shape, device, p, prompt, gpu_total, kind, new)
                             + _spot_check_parts(cfg, shape, device, p, prompt, new))


@dataclass(frozen=True)
class Observed:
    """The longest prompt and completion a node trained on, over the steps of its metrics log."""

    prompt_tokens: int
    completion_tokens: int
    steps: int


def observed_lengths(node_dir: Path) -> Observed | None:
    """What the node's `metrics.jsonl` says of its longest sequences (None: no step logged them yet)."""
    rows = [r for r in read_rows(Path(node_dir)) if m.LONGEST_COMPLETION in r and m.LONGEST_PROMPT in r]
    if not rows:
        return None
    return Observed(int(max(r[m.LONGEST_PROMPT] for r in rows)), int(max(r[m.LONGEST_COMPLETION] for r in rows)),
                    len(rows))


# ---- fitting it to the machine ------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    device: Literal["cpu", "cuda"]
    available: int  # bytes free now: free GPU memory, or the RAM the kernel says is available
    total: int  # the device's size (a vLLM engine's share is a fraction of it)
    where: str  # "RAM", "GPU memory (cuda:0)"
    bf16: bool = True  # the GPU computes in bfloat16 (torch.cuda.is_bf16_supported()); unused on a CPU

    @property
    def margin(self) -> int:
        """Bytes `fit` keeps free: FIT_MARGIN of a GPU, nothing of RAM (module docstring)."""
        return int(FIT_MARGIN * self.total) if self.device == "cuda" else 0

    @property
    def usable(self) -> int:
        """What the plan may fill: the available bytes less the margin."""
        return max(0, self.available - self.margin)

    def describe(self) -> str:
        """`70.00 GiB of 79.20 GiB GPU memory (cuda:0) available, 7.92 GiB of it kept free` for a line of text."""
        kept = f", {gib(self.margin)} of it kept free ({FIT_MARGIN:.0%} of the GPU)" if self.margin else ""
        return f"{gib(self.available)} of {gib(self.total)} {self.where} available{kept}"


@dataclass(frozen=True)
class Fit:
    micro_batch: int
    gradient_checkpointing: bool
    plan: MemoryPlan


def fit(cfg: NodeConfig, shape: ModelShape, budget: Budget, prompt_tokens: int | None = None,
        generator: str | None = None) -> Fit:
    """The micro-batch and checkpointing the node runs with (see the module docstring); InputError
    when nothing fits."""

    def plan(m: int, ckpt: bool) -> MemoryPlan:
        return node_plan(cfg, shape, budget.device, micro_batch=m, checkpointing=ckpt, prompt_tokens=prompt_tokens,
                         gpu_total=budget.total, generator=generator, bf16=budget.bf16)

    cap = max_rows(cfg)  # rows beyond it never share a micro-batch: a larger value plans as this one
    wanted = cfg.train.micro_batch_size

    def largest(ckpt: bool) -> Fit | None:
        for rows in range(cap, 0, -1):
            if (p := plan(rows, ckpt)).total <= budget.usable:
                return Fit(rows, ckpt, p)
        return None

    options = [True] if cfg.train.gradient_checkpointing else [False, True]
    if wanted:  # set: kept when it fits (with checkpointing if only that fits), else refused
        for ckpt in options:
            if (p := plan(min(wanted, cap), ckpt)).total <= budget.usable:
                return Fit(wanted, ckpt, p)
        found = next((f for f in map(largest, options) if f is not None), None)
        if found is not None:
            need = plan(min(wanted, cap), options[-1]).total
            raise InputError(
                f"train.micro_batch_size={wanted} needs ~{gib(need)} by the memory plan, {budget.describe()}",
                f"set train.micro_batch_size={found.micro_batch} (the largest that fits"
                + (", with train.gradient_checkpointing=true" if found.gradient_checkpointing else "")
                + "), or 0 to pick it at start; `swarm-node doctor` shows the plan by part")
    else:  # 0: the largest that fits, without checkpointing when anything does
        found = next((f for f in map(largest, options) if f is not None), None)
        if found is not None:
            return found
    raise nothing_fits(cfg, shape, budget, plan(1, True), prompt_tokens, generator)


def nothing_fits(cfg: NodeConfig, shape: ModelShape, budget: Budget, smallest: MemoryPlan,
                 prompt_tokens: int | None, generator: str | None) -> InputError:
    """The one line for a node that does not fit even at micro-batch 1 with checkpointing."""

    def total(c: NodeConfig) -> int:
        return node_plan(c, shape, budget.device, micro_batch=1, checkpointing=True, prompt_tokens=prompt_tokens,
                         gpu_total=budget.total, generator=generator, bf16=budget.bf16).total

    def with_(**sets: Any) -> NodeConfig:
        data = cfg.model_dump()
        for dotted, value in sets.items():
            section, key = dotted.split("__")
            data[section][key] = value
        return NodeConfig.model_validate(data)

    would: list[str] = []
    lora = with_(model__lora={**cfg.model.lora.model_dump(), "enabled": True})
    if not cfg.model.lora.enabled and (n := total(lora)) <= budget.usable:
        would.append(f"model.lora.enabled=true (~{gib(n)})")
    g = cfg.generation
    for key, now in (("generation__max_new_tokens", g.max_new_tokens), ("generation__group_size", g.group_size)):
        value = now // 2
        while value >= 1 and total(with_(**{key: value})) > budget.usable:
            value //= 2
        if value >= 1:
            would.append(f"{key.replace('__', '.')}={value} (~{gib(total(with_(**{key: value})))})")
    parts = smallest.by_name()
    per_param = sum(parts.get(k, 0) for k in ("weights", "compute copy", "optimizer", "gradients")) / shape.params
    room = budget.usable - (smallest.total - per_param * shape.params)
    if room > 0:
        would.append(f"a smaller model, of at most ~{room / per_param / 1e9:.2g}B parameters")
    at_peak = [p for p in smallest.parts if p.phase in ("static", smallest.peak_phase)]
    largest = sorted(at_peak, key=lambda p: -p.bytes)[:3]
    return InputError(
        f"{cfg.model.name} does not fit in {budget.describe()}: the memory plan needs "
        f"~{gib(smallest.total)} even at micro-batch 1 with gradient checkpointing ("
        + ", ".join(f"{p.name} {gib(p.bytes)}" for p in largest) + ")",
        ("what would fit: " + "; or ".join(would) if would else "use a smaller model or a machine with more memory")
        + " (`swarm-node doctor` shows the plan by part)")


def machine_budget(device_name: str) -> Budget | None:
    """This machine's memory for a node on `device_name` (auto, cpu, cuda, cuda:N); None if unknown."""
    if device_name == "auto" or device_name.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            index = int(device_name.split(":")[1]) if ":" in device_name else torch.cuda.current_device()
            free, total = torch.cuda.mem_get_info(index)
            with torch.cuda.device(index):
                bf16 = bool(torch.cuda.is_bf16_supported())
            return Budget("cuda", int(free), int(total), f"GPU memory (cuda:{index})", bf16)
        if device_name != "auto":
            return None
    ram = ram_bytes()
    return None if ram is None else Budget("cpu", ram[1], ram[0], "RAM")


def ram_bytes() -> tuple[int, int] | None:
    """(total, available) RAM in bytes from /proc/meminfo; None elsewhere."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return int(info["MemTotal"].split()[0]) * 1024, int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def longest_prompt_tokens(cfg: NodeConfig, prompt_set: Any) -> int | None:
    """The prompt set's longest rendered prompt in this model's tokens, when its tokenizer loads
    without the model (a tiny spec, a local or cached directory, the converted embedded model)."""
    if prompt_set is None:
        return None
    try:
        tokenizer = _tokenizer_without_model(cfg.model)
    except (OSError, ValueError):
        return None
    if tokenizer is None:
        return None
    from swarm_node.tasks.prompt_lengths import longest_prompt

    return longest_prompt(tokenizer, prompt_set.problems, cfg.task.system_prompt, cfg.task.worked_example)[0] or None


def _tokenizer_without_model(model: ModelConfig) -> Any:
    if model.name.startswith("tiny-random:"):
        from swarm_node.policy import tiny

        return tiny.build_tiny_tokenizer(tiny.parse_tiny_spec(model.name).variant)
    if model.name == EMBEDDED_NAME:  # its directory once converted (`models.ensure_embedded_dir`), by name
        from swarm_node.policy import models

        found = sorted(models.cache_root(model).glob("smollm2-135m-instruct-*/tokenizer_config.json"))
        where = found[-1].parent if found else None
    else:
        where = model_dir(model.name, model.revision)
    if where is None or not (where / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(where)
