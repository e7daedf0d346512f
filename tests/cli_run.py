"""Running `swarm-node` in-process for CLI tests: exit code, stdout and stderr lines."""
from __future__ import annotations

import signal

import pytest

from swarm_node.util import lifecycle
from swarm_node.ops.cli import app


@pytest.fixture(autouse=True)
def _restore_signals():
    """A command installs signal handlers; give the next test the ones it started with."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
    lifecycle.reset()


def run(capsys, *argv: str) -> tuple[int, str, list[str]]:
    """(exit code, stdout, stderr lines) of `swarm-node argv...`."""
    with pytest.raises(SystemExit) as exc:
        app(list(argv))
    out, err = capsys.readouterr()
    return exc.value.code, out, [ln for ln in err.splitlines() if ln.strip()]
