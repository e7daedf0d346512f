"""What `swarm-node local` shows while its nodes run: a live table on a terminal, plain lines elsewhere.

On a terminal the table is redrawn in place and fits 80 columns (short column names, model names
cut to their last path part). When stdout is a file or a pipe (a log, CI, `| tee`), nothing is
redrawn: each node's new steps are printed as one line each, so the log reads top to bottom.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from swarm_node.util.jsonl import read_rows

MODEL_WIDTH = 14
NAME_WIDTH = 12  # widths: name 12, model 14, step 6, reward 6, acc 4, peer 4, filt 4, drop 4, tok/s 5, state 8


def short_model(name: str, lora: bool, width: int = MODEL_WIDTH) -> str:
    """`org/Some-Model-1.5B` -> `Some-Model-1.5B`, cut to `width` (with +L for LoRA)."""
    suffix = "+L" if lora else ""
    base = name.rstrip("/").rsplit("/", 1)[-1]
    room = width - len(suffix)
    return (base if len(base) <= room else base[: room - 1] + "~") + suffix


def _state(proc: Any) -> str:
    rc = proc.poll()
    return "running" if rc is None else ("done" if rc == 0 else f"exit {rc}")


def _dropped(m: dict[str, float], prefix: str = "total_dropped_") -> int:
    """Peer data dropped since the node started (`total_dropped_*`), or in the step (`dropped_*`)."""
    return int(sum(v for k, v in m.items() if k.startswith(prefix)))


def status_table(procs: list[Any], steps: int) -> Table:
    """One row per node, at most 80 columns wide."""
    # No borders, one space between columns: 10 columns in at most 77 characters.
    table = Table(box=None, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, header_style="bold")
    for col in ("node", "model", "step", "reward", "acc", "peer", "filt", "drop", "tok/s", "state"):
        table.add_column(col, justify="left" if col in ("node", "model", "state") else "right", no_wrap=True)
    for p in procs:
        rows = read_rows(p.node_dir)
        m = rows[-1] if rows else {}
        table.add_row(p.name[:NAME_WIDTH], short_model(p.model, p.lora), f"{int(m.get('step', 0))}",
                      f"{m.get('reward_mean', 0):.2f}",
                      f"{m.get('accuracy', 0):.2f}", f"{int(m.get('peer_samples_used', 0))}",
                      f"{int(m.get('filtered_nonpositive_advantage', 0) + m.get('filtered_kl', 0))}",
                      f"{_dropped(m)}", f"{m.get('tokens_per_s', 0):.0f}"[:5], _state(p.proc)[:8])
    return table


def step_line(name: str, m: dict[str, float], steps: int) -> str:
    """One plain log line for one step of one node."""
    return (f"{name} step {int(m.get('step', 0))}/{steps} reward {m.get('reward_mean', 0):.3f} "
            f"acc {m.get('accuracy', 0):.3f} own {int(m.get('own_samples', 0))} "
            f"peer {int(m.get('peer_samples', 0))} used {int(m.get('peer_samples_used', 0))} "
            f"filtered {int(m.get('filtered_nonpositive_advantage', 0))}/{int(m.get('filtered_kl', 0))} "
            f"dropped {_dropped(m, 'dropped_')} tok/s {m.get('tokens_per_s', 0):.0f} "
            f"step_s {m.get('step_seconds', 0):.1f}" + _heldout_part(m))


def _heldout_part(m: dict[str, float]) -> str:
    """' held-out 0.234 [0.147, 0.351]' when the node evaluated after this step (eval_step == step), else ''."""
    if "eval_step" not in m or m.get("eval_step") != m.get("step"):
        return ""
    return f" held-out {m['eval_accuracy']:.3f} [{m.get('eval_lo', 0):.3f}, {m.get('eval_hi', 1):.3f}]"


class LiveView:
    """`update(procs)` every poll; `close(procs)` once at the end (prints the final state)."""

    def __init__(self, console: Console, steps: int) -> None:
        self.console = console
        self.steps = steps
        self.tty = console.is_terminal
        self._live: Live | None = None
        self._printed: dict[str, int] = {}  # node name -> metrics rows already printed
        self._states: dict[str, str] = {}
        self._first = True

    def update(self, procs: list[Any]) -> None:
        if self._first:
            self.console.print(f"{len(procs)} nodes, {self.steps} steps each; columns: reward and acc of own "
                               "samples, peer samples used, filtered, dropped", soft_wrap=True)
            self._first = False
        if self.tty:
            if self._live is None:
                self._live = Live(status_table(procs, self.steps), console=self.console, refresh_per_second=1)
                self._live.start()
            else:
                self._live.update(status_table(procs, self.steps))
            return
        self._print_new_lines(procs)

    def _print_new_lines(self, procs: list[Any]) -> None:
        for p in procs:
            rows = read_rows(p.node_dir)
            for m in rows[self._printed.get(p.name, 0):]:
                print(step_line(p.name, m, self.steps), flush=True)
            self._printed[p.name] = len(rows)
            state = _state(p.proc)
            if state != self._states.get(p.name, "running"):
                print(f"{p.name} {state}", flush=True)
            self._states[p.name] = state

    def close(self, procs: list[Any]) -> None:
        if self._live is not None:
            self._live.update(status_table(procs, self.steps))
            self._live.stop()
            self._live = None
            return
        if not self.tty:
            self._print_new_lines(procs)
        else:
            self.console.print(status_table(procs, self.steps))
