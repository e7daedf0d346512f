"""What the `swarm-node` commands share: their common options and the helpers every command uses to set
up logging and load a node configuration (one line per bad input, `errors.ConfigError`)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from swarm_node.config import NodeConfig
from swarm_node.errors import ConfigError, describe

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML config file.", exists=True, dir_okay=False)]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override: section.field=value (TOML value).")]
PeerOpt = Annotated[Optional[list[str]], typer.Option("--initial-peer", "-p", help="Multiaddr of a peer to bootstrap from.")]
NodeDirOpt = Annotated[Optional[Path], typer.Option("--node-dir", help="Node directory (identity, checkpoints, logs).",
                                                    show_default="node_dir of the config: ./node")]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", min=1, help="Train until this step (train.total_steps).",
                                                 show_default="train.total_steps of the config: 100")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logs; tracebacks on errors.")]


def setup_logging(verbose: bool = False) -> None:
    verbose = verbose or any(a in ("-v", "--verbose") for a in sys.argv[1:2])
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("hivemind", "httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    quiet_progress_bars()


def quiet_progress_bars() -> None:
    """When stderr is a log file or a pipe (a grid worker's, relayed by its parent): no `\r` progress
    bars from transformers or the hub (call before transformers is imported; a user's setting wins)."""
    if not sys.stderr.isatty():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")


def load_config(config: Path | None, sets: list[str] | None, extra: list[str]) -> NodeConfig:
    try:
        return NodeConfig.load(config, [*extra, *(sets or [])])
    except OSError as e:
        raise ConfigError(f"cannot read config file {config}: {e.strerror or e}", "check the --config path") from e
    except ValueError as e:  # pydantic's ValidationError, TOML syntax, malformed --set
        typed = describe(e)
        where = f" ({config})" if config is not None else ""
        if typed is not None:
            raise ConfigError(typed.what + where, typed.fix) from e
        raise ConfigError(f"invalid configuration{where}: {e}", "fix the --set override or the file") from e


def peer_overrides(peers: list[str] | None) -> list[str]:
    return [f"swarm.initial_peers={json.dumps(list(peers))}"] if peers else []
