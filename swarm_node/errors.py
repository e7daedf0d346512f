"""Expected failures as typed errors, and the one place that turns them into a line and an exit code.

A failure a user can cause or meet (a typo in the config, a port in use, a peer that does not
answer, a damaged file) is raised as a `SwarmNodeError`: what is wrong, where, and what to do.
`run_cli` prints it as one line on stderr and exits with its code: 2 for bad input (`InputError`:
the command line, config, paths, data files), 1 for a runtime failure (`RuntimeFailure`: the
network, another process, damaged state). `-v`/`--verbose` anywhere on the command line also
prints the traceback. Library exceptions that reach the top are translated by `describe` (config
validation, TOML syntax, data sets, DHT start); anything else is still one line, exit 1, with a
pointer to `-v`. A command stopped by SIGINT/SIGTERM exits 130/143 (see `lifecycle`).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

PROG = "swarm-node"


class SwarmNodeError(Exception):
    """An expected failure: `what` went wrong (naming the file, address or value), `fix` says what to do."""

    exit_code = 1

    def __init__(self, what: str, fix: str | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.fix = fix

    def line(self) -> str:
        return f"{self.what}; {self.fix}" if self.fix else self.what

    def __str__(self) -> str:
        return self.line()


class InputError(SwarmNodeError):
    """Bad input: command line, configuration, paths, data files, addresses (exit 2)."""

    exit_code = 2


class RuntimeFailure(SwarmNodeError):
    """The input was fine but running failed: network, another process, damaged state (exit 1)."""

    exit_code = 1


class ConfigError(InputError):
    """The configuration (file, --set overrides, options) is invalid."""


def one_line(text: str, limit: int = 400) -> str:
    """Collapse whitespace and newlines; cut very long messages."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def validation_message(exc: Any) -> str:
    """A pydantic ValidationError as `field: problem (got value)`, joined by `; `."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "config"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        parts.append(f"{loc}: {msg}{shown}")
    return "; ".join(parts)


def describe(exc: BaseException) -> SwarmNodeError | None:
    """The typed error for a library exception that reached the top, or None when it is unexpected."""
    import tomllib

    from pydantic import ValidationError

    if isinstance(exc, SwarmNodeError):
        return exc
    if isinstance(exc, ValidationError):
        return ConfigError(f"invalid configuration: {one_line(validation_message(exc))}",
                           "fix the file or the --set override (field names: docs/architecture.md, config.py)")
    if isinstance(exc, tomllib.TOMLDecodeError):
        return ConfigError(f"the config file is not valid TOML: {one_line(str(exc))}", "fix the file's syntax")
    name = type(exc).__name__
    if name == "DatasetUnavailable":
        return InputError(one_line(str(exc)))
    if name == "PromptSetEnded":  # its message says what to use instead
        return InputError(one_line(str(exc)))
    if name == "PromptSetError":
        return RuntimeFailure(one_line(str(exc)), "check swarm.prompt_set_id and swarm.prompt_set_owner, and that "
                              "a node holding the set (its seeder, or nodes training on it) is reachable")
    if name == "SwarmConnectError":
        return RuntimeFailure(f"could not join the swarm: {one_line(str(exc))}",
                              "check that a node is running at the --initial-peer address and reachable from here")
    return None


def _verbose(argv: Sequence[str]) -> bool:
    return any(a in ("-v", "--verbose") for a in argv)


def _print_line(text: str) -> None:
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)


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
    from swarm_node import lifecycle

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
