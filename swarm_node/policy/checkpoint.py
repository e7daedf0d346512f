"""Checkpoints that resume training exactly: trainable weights, optimizer, step, RNG states, config.

Layout under the node directory:

    checkpoints/step-00000012/   weights.safetensors  the trainable parameters by name (all weights,
                                                      or only the LoRA adapter)
                                 trainer.pt           Trainer.state_dict() (optimizer, step count)
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
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from swarm_node.atomic import atomic_replace_dir, atomic_write_text
from swarm_node.config import NodeConfig

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
    """Restore weights, optimizer, step and RNG states from the newest checkpoint into `trainer`.

    Returns (step, extra), or None when there is no checkpoint. Raises ValueError when the
    checkpoint belongs to another model (id, tokenizer, or LoRA/full mismatch)."""
    root = Path(node_dir) / CHECKPOINTS
    if root.is_dir():
        _remove_partial(root)
    path = latest_checkpoint(node_dir)
    if path is None:
        return None
    meta = json.loads((path / "meta.json").read_text())
    policy = trainer.policy
    expected = {"model_id": policy.model_id, "fingerprint": policy.fingerprint, "is_lora": policy.is_lora}
    for key, value in expected.items():
        if meta.get(key) != value:
            raise ValueError(f"checkpoint {path} has {key}={meta.get(key)!r}, this node has {value!r}")
    load_weights(path, policy)
    trainer.load_state_dict(torch.load(path / "trainer.pt", map_location=policy.device, weights_only=True))
    _set_rng_state(torch.load(path / "rng.pt", weights_only=True))
    extra = json.loads((path / "extra.json").read_text())
    return int(meta["step"]), extra


def load_weights(path: Path, policy: Any) -> None:
    """Copy a checkpoint's trainable weights into `policy.model` (names must match exactly)."""
    saved = load_file(str(Path(path) / "weights.safetensors"))
    params = dict(policy.trainable_parameters())
    if set(saved) != set(params):
        missing, unexpected = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
        raise ValueError(f"checkpoint {path} weights do not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(saved[name].to(device=param.device, dtype=param.dtype))


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
