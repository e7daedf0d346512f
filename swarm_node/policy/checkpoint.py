"""Checkpoints that resume training exactly: trainable weights, optimizer, step, RNG states, config.

Layout under the node directory:

    checkpoints/step-00000012/   weights.safetensors  the trainable parameters by name (all weights,
                                                      or only the LoRA adapter)
                                 trainer.pt           Trainer.state_dict() (optimizer, step count;
                                                      read onto the CPU, then placed as a fresh
                                                      optimizer places it: `_load_trainer_state`)
                                 rng.pt               torch CPU/CUDA RNG states, python and numpy states
                                 config.toml          the resolved NodeConfig
                                 extra.json           caller's data (node step, peer id, counters)
                                 meta.json            step, model id, tokenizer fingerprint, LoRA or full
    checkpoints/latest           name of the newest complete checkpoint

A checkpoint is written into a temporary directory and moved into place with
`atomic_replace_dir`; `latest` is written atomically afterwards. A process killed at any moment
leaves the previous checkpoint intact; its half-written `.step-*.tmp` directory is removed by the
next save or load. Only the newest `CheckpointConfig.keep` checkpoints are kept.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from swarm_node.util.atomic import atomic_replace_dir, atomic_write_text
from swarm_node.config import ModelConfig, NodeConfig
from swarm_node.util.errors import InputError, RuntimeFailure

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LATEST = "latest"
FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^step-(\d{8,})$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def save_checkpoint(node_dir: Path, trainer: Any, config: NodeConfig, extra: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint of `trainer` at its current step; returns the checkpoint directory."""
    root = Path(node_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    _remove_partial(root)
    step = int(trainer.step_count)
    name = checkpoint_name(step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
    try:
        _write_contents(tmp, trainer, config, extra or {}, step)
        atomic_replace_dir(tmp, root / name)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    atomic_write_text(root / LATEST, name + "\n")
    _prune(root, keep=config.checkpoint.keep, protect=name)
    return root / name


def _write_contents(out: Path, trainer: Any, config: NodeConfig, extra: dict[str, Any], step: int) -> None:
    policy = trainer.policy
    weights = {n: p.detach().contiguous().cpu() for n, p in policy.trainable_parameters()}
    save_file(weights, str(out / "weights.safetensors"), metadata={"step": str(step)})
    torch.save(trainer.state_dict(), out / "trainer.pt")
    torch.save(_rng_state(), out / "rng.pt")
    (out / "config.toml").write_text(config.dump_toml())
    (out / "extra.json").write_text(json.dumps(extra, sort_keys=True, indent=1))
    meta = {"format": FORMAT_VERSION, "step": step, "model_id": policy.model_id, "revision": policy.revision,
            "fingerprint": policy.fingerprint, "is_lora": policy.is_lora}
    (out / "meta.json").write_text(json.dumps(meta, sort_keys=True, indent=1))


def list_checkpoints(node_dir: Path) -> list[Path]:
    """Complete checkpoint directories, oldest first."""
    root = Path(node_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_RE.match(p.name))]
    return [p for _, p in sorted(found) if (p / "meta.json").is_file()]


def latest_checkpoint(node_dir: Path) -> Path | None:
    """The directory `latest` names, else the newest complete one, else None."""
    root = Path(node_dir) / CHECKPOINTS
    pointer = root / LATEST
    if pointer.is_file():
        target = root / pointer.read_text().strip()
        if _STEP_RE.match(target.name) and (target / "meta.json").is_file():
            return target
    found = list_checkpoints(node_dir)
    return found[-1] if found else None


def load_latest_checkpoint(node_dir: Path, trainer: Any) -> tuple[int, dict[str, Any]] | None:
    """Restore weights, optimizer, step and RNG states from the newest intact checkpoint into `trainer`.

    Returns (step, extra), or None when there is no checkpoint. A damaged checkpoint (unreadable
    or missing file) is skipped with a warning naming it, and the next older one is tried; when
    every checkpoint is damaged, raises `errors.RuntimeFailure`. Raises `errors.InputError` when
    the checkpoint belongs to another model (id, tokenizer, or LoRA/full mismatch): the node
    directory is not this node's. Nothing is applied to `trainer` until a checkpoint has been
    read completely."""
    root = Path(node_dir) / CHECKPOINTS
    if root.is_dir():
        _remove_partial(root)
    newest = latest_checkpoint(node_dir)
    candidates = list(reversed(list_checkpoints(node_dir)))
    if newest is not None and newest in candidates:
        candidates.remove(newest)
        candidates.insert(0, newest)
    elif newest is not None:
        candidates.insert(0, newest)
    skipped: list[str] = []
    for path in candidates:
        try:
            loaded = _read_checkpoint(path, trainer.policy)
        except CheckpointDamaged as e:
            log.warning("skipping damaged checkpoint %s: %s", path, e)
            skipped.append(f"{path.name} ({e})")
            continue
        meta, weights, trainer_state, rng, extra = loaded
        _copy_weights(weights, trainer.policy)
        trainer.load_state_dict(trainer_state)
        _set_rng_state(rng)
        if skipped:
            log.warning("resumed from %s after skipping %d damaged checkpoint(s): %s", path.name, len(skipped),
                        "; ".join(skipped))
        return int(meta["step"]), extra
    if skipped:
        raise RuntimeFailure(f"every checkpoint in {root} is damaged: {'; '.join(skipped)}",
                             f"move {root} away to start from step 0, or restore a checkpoint from a backup")
    return None


class CheckpointDamaged(ValueError):
    """A checkpoint directory whose files cannot be read back."""


class CheckpointMismatch(InputError, ValueError):
    """The checkpoint was made by another model: this node directory is not this node's."""


def _read_checkpoint(path: Path, policy: Any) -> tuple[dict, dict, dict, dict, dict]:
    """Everything a checkpoint holds, read and checked, before anything is applied."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        step = int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointDamaged(f"meta.json: {_short(e)}") from e
    expected = {"model_id": policy.model_id, "fingerprint": policy.fingerprint, "is_lora": policy.is_lora}
    for key, value in expected.items():
        if meta.get(key) != value:
            raise CheckpointMismatch(f"checkpoint {path} has {key}={meta.get(key)!r}, this node has {value!r}",
                             "pass another --node-dir, or the model.name/model.lora the checkpoint was made with")
    parts: list[Any] = []
    for name, read in (("weights.safetensors", lambda p: load_file(str(p))),
                       ("trainer.pt", _load_trainer_state),
                       ("rng.pt", lambda p: torch.load(p, weights_only=True)),
                       ("extra.json", lambda p: json.loads(p.read_text()))):
        try:
            parts.append(read(path / name))
        except Exception as e:  # noqa: BLE001  (safetensors, pickle and zip raise many types on damage)
            raise CheckpointDamaged(f"{name}: {_short(e)}") from e
    weights, trainer_state, rng, extra = parts
    _check_weight_names(path, weights, policy)
    meta["step"] = step
    return meta, weights, trainer_state, rng, extra


def _load_trainer_state(path: Path) -> dict[str, Any]:
    """trainer.pt read onto the CPU (memory-mapped: a GPU node's moments are not copied into RAM
    first). `torch.optim.Optimizer.load_state_dict` then moves each moment to its parameter's
    device and leaves each `step` counter where a fresh optimizer keeps it: on the CPU for plain
    AdamW, on the parameter's device for a fused or capturable one. Mapping the file onto the
    policy's device instead would put plain AdamW's counters on the GPU (a host sync per parameter
    tensor at every step, and a device mismatch for whoever compares them with CPU tensors)."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:160] or type(e).__name__


def _check_weight_names(path: Path, saved: dict[str, torch.Tensor], policy: Any) -> None:
    params = dict(policy.trainable_parameters())
    if set(saved) != set(params):
        missing, unexpected = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
        raise CheckpointDamaged(f"weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def _copy_weights(saved: dict[str, torch.Tensor], policy: Any) -> None:
    with torch.no_grad():
        for name, param in policy.trainable_parameters():
            param.copy_(saved[name].to(device=param.device, dtype=param.dtype))
    if hasattr(policy, "weights_changed"):
        policy.weights_changed()  # loaded weights may be trained ones: never declare the base revision


def load_weights(path: Path, policy: Any) -> None:
    """Copy a checkpoint's trainable weights into `policy.model` (names must match exactly).
    Raises `errors.InputError` naming the checkpoint when it is missing, damaged or of another model."""
    file = Path(path) / "weights.safetensors"
    if not file.is_file():
        raise InputError(f"{path} is not a checkpoint (no weights.safetensors)",
                         "pass a directory like NODE_DIR/checkpoints/step-00000012")
    try:
        saved = load_file(str(file))
        _check_weight_names(Path(path), saved, policy)
    except Exception as e:  # noqa: BLE001  (safetensors raises several types on damage)
        raise InputError(f"checkpoint {path} cannot be loaded: {_short(e)}",
                         "pick another checkpoint (or the model it was trained from)") from e
    _copy_weights(saved, policy)


def checkpoint_model_config(path: Path, base: ModelConfig) -> ModelConfig:
    """The model a checkpoint was trained from (name, revision, LoRA settings from its config.toml),
    on `base`'s device, dtypes and cache. Raises `errors.InputError` for a directory that is not a
    readable checkpoint."""
    path = Path(path)
    if not (path / "weights.safetensors").is_file() or not (path / "config.toml").is_file():
        raise InputError(f"{path} is not a checkpoint (it needs weights.safetensors and config.toml)",
                         "pass a directory like NODE_DIR/checkpoints/step-00000012")
    try:
        with open(path / "config.toml", "rb") as f:
            recorded = tomllib.load(f).get("model", {})
        recorded.pop("dtype", None)  # a checkpoint written before compute and parameter dtypes were separate
        model = ModelConfig.model_validate({**recorded, "device": base.device, "compute_dtype": base.compute_dtype,
                                            "param_dtype": base.param_dtype,
                                            "cache_dir": base.cache_dir})
    except (OSError, ValueError) as e:  # TOML and pydantic errors are ValueErrors
        raise InputError(f"checkpoint {path} has an unreadable config.toml ({_short(e)})",
                         "pick another checkpoint") from e
    return model


def _rng_state() -> dict[str, Any]:
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "mt": list(mt), "gauss": gauss},
        "numpy": {"name": np_name, "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "cached": float(np_cached)},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["mt"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _remove_partial(root: Path) -> None:
    """Delete temporary directories left by a process killed while writing a checkpoint."""
    for stale in root.glob(".step-*.tmp"):
        if stale.is_dir():
            shutil.rmtree(stale)


def _prune(root: Path, keep: int, protect: str) -> None:
    found = list_checkpoints(root.parent)
    for path in found[: max(0, len(found) - keep)]:
        if path.name != protect:
            shutil.rmtree(path)
