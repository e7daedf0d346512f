"""What the `swarm-node` commands share: `run_cli`, which runs every command (signals handled from the
first instant, an expected failure as one line and its exit code: `errors`), their common options,
and the helpers every command uses to set up logging and load a node configuration (one line per bad
input, `errors.ConfigError`)."""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer

from swarm_node.util import lifecycle
from swarm_node.config import NodeConfig
from swarm_node.util.errors import ConfigError, describe, one_line
from swarm_node.util.inert import inert

PROG = "swarm-node"

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML config file.", exists=True, dir_okay=False)]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override: section.field=value (TOML value).")]
PeerOpt = Annotated[Optional[list[str]], typer.Option("--initial-peer", "-p", help="Multiaddr of a peer to bootstrap from.")]
NodeDirOpt = Annotated[Optional[Path], typer.Option("--node-dir", help="Node directory (identity, checkpoints, logs).",
                                                    show_default="node_dir of the config: ./node")]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", min=1, help="Train until this step (train.total_steps).",
                                                 show_default="train.total_steps of the config: 100")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logs; tracebacks on errors.")]


class InertFormatter(logging.Formatter):
    """Log lines whose message is inert (`util.inert`): a peer's string in a message (its model id,
    an address, a reason it named) can neither drive the terminal nor forge a line. A traceback,
    added after the message, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's naming)
        return inert(super().formatMessage(record))


def setup_logging(verbose: bool = False) -> None:
    verbose = verbose or any(a in ("-v", "--verbose") for a in sys.argv[1:2])
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(InertFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
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


def _verbose(argv: Sequence[str]) -> bool:
    return any(a in ("-v", "--verbose") for a in argv)


def _print_line(text: str) -> None:
    print(f"{PROG}: error: {inert(text)}", file=sys.stderr, flush=True)  # may quote a peer's words


def _cli_exception_types() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """(usage errors, exits, aborts) of click and of typer's vendored copy of click, where present."""
    found: list[tuple[type, type, type]] = []  # (usage error, exit, abort) of each copy
    try:
        import click

        found.append((click.ClickException, click.exceptions.Exit, click.exceptions.Abort))
    except ImportError:
        pass
    try:
        import typer.exceptions
        from typer._click import exceptions as typer_click

        found.append((typer_click.ClickException, typer.exceptions.Exit, typer.exceptions.Abort))
    except ImportError:
        pass
    usage, exits, aborts = (tuple(col) for col in zip(*found)) if found else ((), (), ())
    return usage, exits, aborts


def run_cli(main: Callable[[list[str]], Any], argv: Sequence[str] | None = None) -> NoReturn:
    """Run `main(argv)` (a click command in non-standalone mode) with signal handling from the first
    instant, and exit with the right code after printing at most one error line."""
    usage_errors, exits, aborts = _cli_exception_types()

    lifecycle.install_signal_handlers()
    lifecycle.watch_parent_from_env()
    args = list(sys.argv[1:] if argv is None else argv)
    code = 0
    try:
        rv = main(args)
        code = rv if isinstance(rv, int) else 0
    except KeyboardInterrupt:  # lifecycle.Interrupted, or a Ctrl-C before its handler was installed
        code = 0 if lifecycle.received_signal() is not None else 130
    except exits as e:
        code = e.exit_code
    except usage_errors as e:  # usage errors: one line, exit 2
        if type(e).__name__ == "NoArgsIsHelpError":
            e.show()  # `swarm-node` alone: the help text
        else:
            ctx = getattr(e, "ctx", None)
            where = f" (see: {ctx.command_path} --help)" if ctx is not None else " (see: swarm-node --help)"
            _print_line(one_line(e.format_message()) + where)
        code = e.exit_code
    except aborts:
        code = 0  # Ctrl-C arriving as the CLI library's Abort
    except Exception as e:  # noqa: BLE001  (the top of the program: everything ends in one line)
        typed = describe(e)
        if _verbose(args):
            traceback.print_exc()
        if typed is not None:
            _print_line(typed.line())
            code = typed.exit_code
        else:
            _print_line(f"unexpected {type(e).__name__}: {one_line(str(e))} (run with -v for the traceback)")
            code = 1
    signum = lifecycle.received_signal()
    if signum is not None and code in (0, 1, 130):  # typer turns KeyboardInterrupt into exit 130
        code = lifecycle.exit_code_for(signum)
        print(f"{PROG}: stopped by {lifecycle.signal_name(signum)}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    sys.exit(code)
