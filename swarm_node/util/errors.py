"""Expected failures as typed errors, and their translation into one line and an exit code.

A failure a user can cause or meet (a typo in the config, a port in use, a peer that does not
answer, a damaged file) is raised as a `SwarmNodeError`: what is wrong, where, and what to do.
`cli.common.run_cli`, which every command runs under, prints it as one line on stderr and exits
with its code: 2 for bad input (`InputError`:
the command line, config, paths, data files), 1 for a runtime failure (`RuntimeFailure`: the
network, another process, damaged state). `-v`/`--verbose` anywhere on the command line also
prints the traceback. Library exceptions that reach the top are translated by `describe` (config
validation, TOML syntax, data sets, DHT start); anything else is still one line, exit 1, with a
pointer to `-v`. A command stopped by SIGINT/SIGTERM exits 130/143 (see `lifecycle`).
"""

from __future__ import annotations

from typing import Any


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
