"""Checks that run before a model is loaded, so a typo costs a second, not a model load.

`check_node(cfg)` validates what can be validated without the model: the node directory (a
directory, writable, its checkpoints/ writable), the identity key, initial-peer multiaddrs,
listening ports (DHT and Prometheus, free to bind), the model name (a tiny spec, the embedded
model, a local model directory or a well-formed hub id), the task's data (loaded, so a missing
file or a row with the wrong keys is reported here) and a checkpoint left by another model. Each
problem raises an `errors.InputError` (exit 2) naming the value and what to do. `fit_memory(cfg,
prompt_set)` then fits the node to this machine's memory (`swarm_node.node.memory_budget`): it picks the
micro-batch (and gradient checkpointing when needed), or refuses with what would fit.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swarm_node.config import NodeConfig
from swarm_node.util.errors import InputError, RuntimeFailure, one_line

log = logging.getLogger(__name__)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_node(cfg: NodeConfig) -> Any:
    """Every check below; returns the loaded prompt set (None when it comes from the swarm)."""
    check_node_dir(Path(cfg.node_dir))
    if cfg.swarm.enabled:
        check_initial_peers(cfg.swarm.initial_peers)
    check_model_name(cfg.model.name)
    if cfg.swarm.enabled:
        check_identity(Path(cfg.node_dir))
        check_listen_maddrs(cfg.swarm.host_maddrs)
    if cfg.metrics.prometheus_addr:
        check_prometheus_addr(cfg.metrics.prometheus_addr)
    check_checkpoint_model(Path(cfg.node_dir), cfg)
    return None if cfg.swarm.prompt_set_id is not None else check_task_data(cfg)


def _writable(path: Path) -> bool:
    try:
        fd, name = tempfile.mkstemp(prefix=".write-check.", dir=path)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def check_node_dir(node_dir: Path) -> None:
    """A directory (created if missing) that this user can write, with a writable checkpoints/."""
    if node_dir.exists() and not node_dir.is_dir():
        raise InputError(f"node directory {node_dir} is a file, not a directory",
                         "pass a directory with --node-dir (or node_dir in the config)")
    try:
        node_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create node directory {node_dir}: {e.strerror or e}",
                         "pass a directory you can write with --node-dir") from e
    if (node_dir / "checkpoints").exists() and not (node_dir / "checkpoints").is_dir():
        raise InputError(f"{node_dir / 'checkpoints'} is a file: checkpoints cannot be written",
                         "move it away, or pass another --node-dir")
    for path in (node_dir, node_dir / "checkpoints"):
        if path.is_dir() and not _writable(path):
            raise InputError(f"{path} is not writable", f"fix its permissions (chmod -R u+w {path}) "
                             "or pass another --node-dir")


def check_identity(node_dir: Path) -> None:
    """An existing identity.key must be a readable key with private permissions."""
    from swarm_node.swarm.identity import IDENTITY_FILENAME, load_or_create_key

    path = node_dir / IDENTITY_FILENAME
    if path.exists():
        load_or_create_key(path)  # raises InputError naming the file and the fix


_PEER_SHAPE = re.compile(r"^/.+/p2p/[1-9A-HJ-NP-Za-km-z]+$")  # checked before importing hivemind (seconds)


def check_initial_peers(peers: Sequence[str]) -> None:
    for addr in peers:
        try:
            if not _PEER_SHAPE.match(addr):
                raise ValueError("no /p2p/<peer id> at the end")
            from swarm_node.swarm.addresses import check_initial_peers as parse

            parse([addr])
        except ValueError as e:
            raise InputError(f"--initial-peer {addr!r} is not a full multiaddr ending in /p2p/<peer id>",
                             "copy the whole address a running node prints after 'join through', e.g. "
                             "/ip4/1.2.3.4/tcp/31337/p2p/Qm...") from e


def _port_free(host: str, port: int, family: int = socket.AF_INET) -> OSError | None:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


def check_listen_maddrs(maddrs: Sequence[str]) -> None:
    """DHT listen addresses: parseable, and a fixed TCP port must be free."""
    from hivemind.utils.multiaddr import Multiaddr

    for addr in maddrs:
        try:
            m = Multiaddr(addr)
            protos = {p.name: m.value_for_protocol(p.code) for p in m.protocols()}
        except Exception as e:  # noqa: BLE001  (multiaddr raises several unrelated types)
            raise InputError(f"swarm.host_maddrs entry {addr!r} is not a multiaddr ({one_line(str(e), 120)})",
                             "use e.g. /ip4/0.0.0.0/tcp/31337") from e
        port = int(protos.get("tcp") or 0)
        host = protos.get("ip4") or protos.get("ip6")
        if port and host:
            family = socket.AF_INET6 if "ip6" in protos else socket.AF_INET
            err = _port_free(host, port, family)
            if err is not None:
                raise InputError(f"cannot listen on {addr} (swarm.host_maddrs): {err.strerror or err}",
                                 "stop the process using that port or choose another (tcp/0 picks a free one)")


def check_prometheus_addr(addr: str) -> None:
    from swarm_node.observe.prometheus import parse_addr

    try:
        host, port = parse_addr(addr)
    except ValueError as e:
        raise InputError(f"metrics.prometheus_addr: {e}", "use host:port, e.g. 127.0.0.1:9400") from e
    if port:
        err = _port_free(host, port)
        if err is not None:
            raise InputError(f"cannot serve metrics on {addr} (metrics.prometheus_addr): {err.strerror or err}",
                             "stop the process using that port or choose another")


def check_model_name(name: str) -> None:
    """A tiny spec, the embedded model, a local model directory, or something shaped like a hub id."""
    if name.startswith("tiny-random:"):
        from swarm_node.policy import tiny

        try:
            tiny.parse_tiny_spec(name)
        except ValueError as e:
            raise InputError(f"model.name: {e}") from e
        return
    if name == "smollm2-135m":
        return
    path = Path(name).expanduser()
    if path.exists() or name.startswith((".", "/", "~")):
        if not path.is_dir():
            raise InputError(f"model.name {name!r} is not a directory",
                             "pass a model directory (with config.json), a hub id, or smollm2-135m")
        if not (path / "config.json").is_file():
            raise InputError(f"model.name {name!r} is a directory without config.json: not a transformers model",
                             "pass the directory that holds config.json and the weights")
        return
    if not _HUB_ID.match(name):
        raise InputError(f"model.name {name!r} is neither a local directory nor a hub id (owner/name)",
                         "pass e.g. Qwen/Qwen2.5-0.5B-Instruct, a local directory, or smollm2-135m")


def check_task_data(cfg: NodeConfig) -> Any:
    """Load the prompt set now: a missing file, bad JSON or wrong keys surface before the model loads."""
    from swarm_node.tasks import load_prompt_set

    try:
        return load_prompt_set(cfg.task)
    except InputError:
        raise
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        raise InputError(f"task.source {cfg.task.source!r}: {one_line(str(e), 300)}",
                         f"pass a {cfg.task.name} .jsonl file (see docs/architecture.md) or a hub id") from e


def expected_model_id(name: str) -> str:
    """The model id a checkpoint of `model.name` records (see models.load_policy)."""
    from swarm_node.policy import models

    if name == models.EMBEDDED_NAME:
        return models.EMBEDDED_MODEL_ID
    path = Path(name).expanduser()
    return str(path.resolve()) if path.is_dir() else name


def check_checkpoint_model(node_dir: Path, cfg: NodeConfig) -> None:
    """The node directory's checkpoints must be of this model (id and LoRA/full) to resume."""
    if not (node_dir / "checkpoints").is_dir():
        return
    from swarm_node.policy.checkpoint import list_checkpoints

    found = list_checkpoints(node_dir)
    if not found:
        return
    try:
        meta = json.loads((found[-1] / "meta.json").read_text())
    except (OSError, ValueError):
        return  # a damaged checkpoint: loading falls back to an older one
    want = {"model_id": expected_model_id(cfg.model.name), "is_lora": cfg.model.lora.enabled}
    for key, value in want.items():
        if key in meta and meta[key] != value:
            raise InputError(f"{node_dir} holds checkpoints of another model ({key}={meta[key]!r}, this config "
                             f"has {value!r}; {found[-1].name})",
                             "pass another --node-dir, or the model.name/model.lora the checkpoints were made with")


def fetch_model_shape(name: str, revision: str | None = None) -> tuple[Any, str]:
    """The shape of a hub model that is not in the local cache, from its config.json alone (a few KB,
    fetched into the hub cache before the weights are), and a phrase saying where it came from or
    why it is unknown (offline, a typo, a gated model: the hub client's reason)."""
    from swarm_node.node import memory_budget as mb
    from swarm_node.policy.memory import ModelShape

    shape = mb.model_shape_of_name(name, revision)
    if shape is not None:
        return shape, "this machine's copy of its config"
    if Path(name).expanduser().exists() or "/" not in name or not _HUB_ID.match(name):
        return None, f"{name} has no readable config.json"
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(name, "config.json", revision=revision)
        config = json.loads(Path(path).read_text())
    except Exception as e:  # noqa: BLE001  (hub client errors: offline, not found, gated; a damaged file)
        reason = " ".join(str(e).split()).split(". ")[0][:160]
        return None, f"its config.json could not be fetched from the hub ({type(e).__name__}: {reason})"
    shape = ModelShape.from_config(config) if isinstance(config, dict) else None
    return shape, ("its config.json, fetched from the hub" if shape is not None
                   else "its config.json names no decoder sizes this plan knows")


def fit_memory(cfg: NodeConfig, prompt_set: Any) -> None:
    """Fit the node to this machine's memory before the model loads (`memory_budget.fit`): sets
    `train.micro_batch_size` when it is 0 (the largest that fits) and `train.gradient_checkpointing`
    when only checkpointing makes it fit; InputError naming what would fit when nothing does. A hub
    model not in the local cache is planned from its config.json, fetched alone first
    (`fetch_model_shape`); one whose config cannot be fetched (offline) is not planned: one warning
    line says so, and 0 then means the default micro-batch."""
    from swarm_node.node import memory_budget as mb
    from swarm_node.config import TrainConfig

    shape, source = fetch_model_shape(cfg.model.name, cfg.model.revision)
    budget = mb.machine_budget(cfg.model.device) if shape is not None else None
    if shape is None or budget is None:
        if cfg.train.micro_batch_size == 0:
            cfg.train.micro_batch_size = TrainConfig.model_fields["micro_batch_size"].default
        if shape is None:
            log.warning("memory plan: none for %s: %s; train.micro_batch_size=%d unchecked (a smaller one, or "
                        "train.gradient_checkpointing=true, if it runs out of memory)", cfg.model.name, source,
                        cfg.train.micro_batch_size)
        else:
            log.info("memory plan: this machine's memory is unknown; train.micro_batch_size=%d",
                     cfg.train.micro_batch_size)
        return
    prompt = mb.longest_prompt_tokens(cfg, prompt_set)
    chosen = mb.fit(cfg, shape, budget, prompt)
    if chosen.micro_batch != cfg.train.micro_batch_size:
        cfg.train.micro_batch_size = chosen.micro_batch
    if chosen.gradient_checkpointing and not cfg.train.gradient_checkpointing:
        log.warning("memory plan: nothing fits without gradient checkpointing: "
                    "train.gradient_checkpointing switched on")
        cfg.train.gradient_checkpointing = True
    log.info("memory plan: ~%s at train.micro_batch_size=%d%s, %s (prompt %d tokens; shape from %s)",
             mb.gib(chosen.plan.total), chosen.micro_batch, " with gradient checkpointing"
             if chosen.gradient_checkpointing else "", budget.describe(),
             prompt or cfg.generation.max_prompt_tokens, source)


def check_checkpoint_dir(path: Path) -> None:
    """`eval --checkpoint PATH`: a checkpoint directory (checked before torch is imported)."""
    if not (path / "weights.safetensors").is_file() or not (path / "config.toml").is_file():
        raise InputError(f"{path} is not a checkpoint (it needs weights.safetensors and config.toml)",
                         "pass a directory like NODE_DIR/checkpoints/step-00000012")


def node_failure(name: str, log_path: Path) -> RuntimeFailure:
    """A node process of `swarm-node local` failed: its own error line from its log."""
    return RuntimeFailure(f"node {name} failed: {last_error_line(log_path)}", f"full log: {log_path}")


def last_error_line(log_path: Path) -> str:
    """The last `swarm-node: error:` line of a log, else its last non-empty line."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    for ln in reversed(lines):
        if ln.startswith("swarm-node: error:"):
            return ln.removeprefix("swarm-node: error:").strip()
    return one_line(lines[-1], 300) if lines else "exited before writing anything to its log"
