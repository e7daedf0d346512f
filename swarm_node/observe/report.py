"""`swarm-node report RUN_DIR`: PNG plots and a markdown summary from the nodes' metrics logs.

A run directory holds one directory per node, each with a `metrics.jsonl` (at any depth; a
node directory passed on its own works too). The report goes next to them:

    RUN_DIR/report/summary.md       per-node table + links to the plots
    RUN_DIR/report/summary.json     the same numbers, one object per node
    RUN_DIR/report/<plot>.png       reward, accuracy, filtered fraction, KL, importance weights,
                                    held-out accuracy over steps with 95% intervals (when the nodes evaluated)

Each node's log is read as its last run of each step (`util.jsonl.latest_run`): rows of steps a
resumed node ran again are superseded by the new ones, so no step counts twice.

Numbers in the table (pure functions below, so tests can check them by hand):
  steps                number of step records
  reward first/last    mean of `reward_mean` over the first / last `window` records that have it
  reward quarters      mean of `reward_mean` over the first / last quarter of the records (at least one)
  mixed groups         mean of `mixed_groups`: share of own groups whose rewards differ
  held-out before/after  accuracy of the node's step-0 evaluation and of its last later one
                       (`evals.jsonl` beside the metrics, see evaluation/heldout.py), each with its 95%
                       Wilson interval, and the change in words: "improved", "no measurable change"
                       or "worse" (evaluation/stats.py: exact McNemar test on the problems whose answer
                       changed, at the 5% level)
  peer gradient        sum of `peer_samples_gradient`: peer samples that carried gradient
  accuracy last        mean of `accuracy` over the last `window` records
  eval accuracy        the last `eval_accuracy` seen (blank when no evaluation ran)
  own / peer used      sums of `own_samples` / `peer_samples_used` over the run
  filtered             mean of `filtered_fraction`
  drops                sums of `dropped_<reason>` per reason
  gave                 what the other nodes took of this node's groups: receivers, samples trained
                       on and samples with gradient, from their ledgers when the run holds them,
                       else from its last read of its receipts (given_run.py)
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from swarm_node import metric_names as m
from swarm_node.observe.metrics import read_metrics_jsonl
from swarm_node.util.jsonl import latest_run
from swarm_node.util.atomic import atomic_write_text
from swarm_node.util.errors import InputError
from swarm_node.util.inert import inert
from swarm_node.observe.given_run import gave_by_node, gave_text
from swarm_node.evaluation.heldout import read_evals

METRICS_FILE = "metrics.jsonl"

# plot file stem -> (title, y label, [(metric, line label, line style)])
PLOTS: dict[str, tuple[str, str, list[tuple[str, str, str]]]] = {
    "reward": ("Reward (mean over own samples)", "reward", [(m.REWARD_MEAN, "", "-")]),
    "accuracy": ("Accuracy (own samples)", "accuracy", [(m.ACCURACY, "train", "-")]),  # held-out: heldout.png
    "filtered_fraction": ("Filtered fraction of the batch", "fraction", [(m.FILTERED_FRACTION, "", "-")]),
    "kl": ("Per-sample KL (objective.kl_estimator)", "KL", [(m.KL_MEAN, "mean", "-"), (m.KL_P90, "p90", "--")]),
    "importance_weights": ("Importance weights (before truncation)", "weight",
                           [(m.IS_WEIGHT_MEAN, "mean", "-"), (m.IS_WEIGHT_PEER_MEAN, "peer mean", ":"),
                            (m.IS_WEIGHT_MAX, "max", "--")]),
}


@dataclass(frozen=True)
class NodeSummary:
    name: str
    steps: int
    last_step: int | None
    reward_first: float | None
    reward_last: float | None
    accuracy_last: float | None
    eval_accuracy: float | None
    own_samples: float
    peer_samples_used: float
    filtered_fraction_mean: float | None
    drops: dict[str, float]
    reward_first_quarter: float | None = None
    reward_last_quarter: float | None = None
    mixed_groups_mean: float | None = None
    peer_samples_gradient: float = 0.0
    heldout_before: float | None = None
    heldout_after: float | None = None
    heldout_n: int | None = None
    heldout_before_interval: tuple[float, float] | None = None  # 95% Wilson
    heldout_after_interval: tuple[float, float] | None = None
    heldout_after_step: int | None = None
    heldout_evaluations: int = 0
    # evaluation.stats.Change of after vs before: verdict, test, difference, p_value, gained, lost, diff_lo, diff_hi
    heldout_change: dict | None = None
    gave: dict | None = None  # given_run.gave_by_node: source, receivers, taken, samples, gradient


def find_metrics_files(run_dir: Path) -> dict[str, Path]:
    """`{node name: metrics.jsonl}`; the name is the node directory relative to `run_dir`."""
    run_dir = Path(run_dir)
    found: dict[str, Path] = {}
    for path in sorted(run_dir.rglob(METRICS_FILE)):
        rel = path.parent.relative_to(run_dir)
        found[run_dir.name if rel == Path(".") else rel.as_posix()] = path
    return found


def _series(records: Sequence[dict[str, float]], key: str) -> list[float]:
    return [float(r[key]) for r in records if key in r and r[key] is not None and math.isfinite(float(r[key]))]


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize(name: str, records: Sequence[dict[str, float]], window: int = 5,
              evals: Sequence[dict] = ()) -> NodeSummary:
    """The summary row of one node (see the module docstring for each number); `evals`: its
    evaluation rows (evaluation.heldout.read_evals)."""
    from swarm_node.evaluation.heldout import before_after, before_after_rows, change_between, interval_of

    if window < 1:
        raise ValueError("window must be >= 1")
    rewards = _series(records, m.REWARD_MEAN)
    quarter = max(1, len(rewards) // 4)
    before, after = before_after(list(evals))
    before_row, after_row = before_after_rows(evals)
    steps = _series(records, m.STEP)
    eval_acc = _series(records, m.EVAL_ACCURACY)
    drops: dict[str, float] = {}
    for r in records:
        for reason, n in m.dropped_counts(r).items():
            drops[reason] = drops.get(reason, 0.0) + n
    return NodeSummary(
        name=name,
        steps=len(records),
        last_step=int(max(steps)) if steps else None,
        reward_first=_mean(rewards[:window]),
        reward_last=_mean(rewards[-window:]),
        accuracy_last=_mean(_series(records, m.ACCURACY)[-window:]),
        eval_accuracy=eval_acc[-1] if eval_acc else None,
        own_samples=sum(_series(records, m.OWN_SAMPLES)),
        peer_samples_used=sum(_series(records, m.PEER_SAMPLES_USED)),
        filtered_fraction_mean=_mean(_series(records, m.FILTERED_FRACTION)),
        drops=dict(sorted(drops.items())),
        reward_first_quarter=_mean(rewards[:quarter]),
        reward_last_quarter=_mean(rewards[-quarter:]),
        mixed_groups_mean=_mean(_series(records, m.MIXED_GROUPS)),
        peer_samples_gradient=sum(_series(records, m.PEER_SAMPLES_GRADIENT)),
        heldout_before=before,
        heldout_after=after,
        heldout_n=int(evals[0]["n"]) if evals else None,
        heldout_before_interval=interval_of(before_row) if before_row is not None else None,
        heldout_after_interval=interval_of(after_row) if after_row is not None else None,
        heldout_after_step=int(after_row["step"]) if after_row is not None else None,
        heldout_evaluations=len(evals),
        heldout_change=(vars(change_between(before_row, after_row))
                        if before_row is not None and after_row is not None else None),
    )


def _fmt(v: float | int | None, digits: int = 3) -> str:
    if v is None:
        return ""
    if isinstance(v, int) or digits == 0:
        return str(int(round(v)))
    return f"{v:.{digits}f}"


def summary_table(rows: Sequence[NodeSummary], window: int) -> str:
    """The markdown table of per-node summaries."""
    n = next((r.heldout_n for r in rows if r.heldout_n), None)
    held = f"held-out ({n}) before [95%] | after [95%]" if n else "held-out before [95%] | after [95%]"
    head = (f"| node | steps | {held} | held-out change | reward first quarter | reward last quarter | mixed groups | "
            f"accuracy last {window} | own samples | peer samples used | peer samples with gradient | "
            "its samples with gradient at peers | "
            "filtered fraction (mean) | drops by reason |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        # reasons are metric keys of the logs (named by peers, in `given_dropped_*`): inert, no cell breaks
        drops = ", ".join(f"{_cell(k)}: {int(v)}" for k, v in r.drops.items()) or "none"
        lines.append(
            f"| {_cell(r.name)} | {r.steps} | {heldout_cell(r.heldout_before, r.heldout_before_interval)} | "
            f"{heldout_cell(r.heldout_after, r.heldout_after_interval)} | {change_text(r.heldout_change)} | "
            f"{_fmt(r.reward_first_quarter)} | {_fmt(r.reward_last_quarter)} | {_fmt(r.mixed_groups_mean)} | "
            f"{_fmt(r.accuracy_last)} | {_fmt(r.own_samples, 0)} | {_fmt(r.peer_samples_used, 0)} | "
            f"{_fmt(r.peer_samples_gradient, 0)} | {gave_text(r.gave)} | {_fmt(r.filtered_fraction_mean)} | {drops} |"
        )
    return "\n".join(lines)


def _cell(text: str) -> str:
    """`text` inert (`util.inert`) and unable to end a markdown table cell."""
    return inert(text).replace("|", "\\|")


def heldout_cell(accuracy: float | None, interval: Sequence[float] | None) -> str:
    """'0.234 [0.148, 0.350]': an accuracy and its 95% interval ('' when not evaluated)."""
    if accuracy is None:
        return ""
    return _fmt(accuracy) + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval is not None else "")


def change_text(change: dict | None) -> str:
    """The verdict in words with its evidence (evaluation.stats.Change.text); '' without two evaluations."""
    from swarm_node.evaluation.stats import Change

    return Change(**change).text() if change else ""


def _save(fig, ax, path: Path) -> None:
    """Legend, layout, PNG: the last steps of every plot."""
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")


def plot_heldout(path: Path, evals: dict[str, Sequence[dict]]) -> bool:
    """Held-out accuracy over steps, one line per node, each evaluation with its 95% interval as an
    error bar; False (no file) when no node evaluated."""
    from swarm_node.evaluation.heldout import interval_of

    shown = {name: rows for name, rows in evals.items() if rows}
    if not shown:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    try:
        for i, (name, rows) in enumerate(shown.items()):
            steps = [int(r["step"]) for r in rows]
            acc = [float(r["accuracy"]) for r in rows]
            lo, hi = zip(*(interval_of(r) for r in rows), strict=True)
            ax.errorbar(steps, acc, yerr=[[a - lo_ for a, lo_ in zip(acc, lo, strict=True)],
                                          [hi_ - a for a, hi_ in zip(acc, hi, strict=True)]],
                        fmt="o-", color=f"C{i % 10}", capsize=3, label=name, linewidth=1.5, markersize=4)
        n = int(next(iter(shown.values()))[0]["n"])
        ax.set(title=f"Held-out accuracy (greedy pass@1, {n} problems; bars: 95% interval)", xlabel="step",
               ylabel="accuracy", ylim=(0, 1))
        ax.grid(True, alpha=0.3)
        _save(fig, ax, path)
        return True
    finally:
        plt.close(fig)


def plot_metric(path: Path, runs: dict[str, list[dict[str, float]]], spec: tuple[str, str, list[tuple[str, str, str]]]) -> bool:
    """Draw one metric group vs step, one colour per node; returns False (no file) when no node has it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, ylabel, lines = spec
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    drawn = 0
    try:
        for i, (node, records) in enumerate(runs.items()):
            color = f"C{i % 10}"
            for key, label, style in lines:
                pts = [(float(r[m.STEP]), float(r[key])) for r in records
                       if m.STEP in r and key in r and r[key] is not None and math.isfinite(float(r[key]))]
                if not pts:
                    continue
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, style, color=color, label=f"{node} {label}".strip(), linewidth=1.5)
                drawn += 1
        if drawn == 0:
            return False
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        _save(fig, ax, path)
        return True
    finally:
        plt.close(fig)


def write_report(run_dir: Path | str, out_dir: Path | str | None = None, window: int = 5) -> Path:
    """Write plots and `summary.md` for every node under `run_dir`; returns the summary's path."""
    run_dir = Path(run_dir)
    files = find_metrics_files(run_dir)
    if not files:
        raise InputError(f"no {METRICS_FILE} under {run_dir}: no node has logged a step there",
                         "pass the run directory of `swarm-node local` or a node directory after a step")
    out = Path(out_dir) if out_dir is not None else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    runs = {name: latest_run(read_metrics_jsonl(path)) for name, path in files.items()}
    evals = {name: read_evals(files[name].parent) for name in runs}
    rows = [summarize(name, records, window, evals[name]) for name, records in runs.items()]
    gave = gave_by_node({name: files[name].parent for name in runs}, runs)
    rows = [replace(r, gave=gave[r.name]) for r in rows]
    _write_summary_json(out, rows)
    plotted = [stem for stem, spec in PLOTS.items() if plot_metric(out / f"{stem}.png", runs, spec)]
    if plot_heldout(out / "heldout.png", evals):
        plotted.insert(0, "heldout")
    missing = [stem for stem in PLOTS if stem not in plotted]
    parts = [
        f"# swarm-node run report: {run_dir.name}",
        "",
        f"Nodes: {len(rows)}. Logs: " + ", ".join(f"`{p}`" for p in files.values()),
        "",
        summary_table(rows, window),
        "",
        "## Plots",
        "",
        *[f"![{stem}]({stem}.png)" for stem in plotted],
    ]
    if missing:
        parts += ["", "No data for: " + ", ".join(missing) + "."]
    summary = out / "summary.md"
    atomic_write_text(summary, "\n".join(parts) + "\n")
    return summary


def _write_summary_json(out: Path, rows: Sequence[NodeSummary]) -> None:
    atomic_write_text(out / "summary.json", json.dumps([asdict(r) for r in rows], indent=1))


def read_summary(report_dir: Path) -> list[NodeSummary]:
    """The rows `write_report` saved in `report_dir/summary.json`."""
    data = json.loads((Path(report_dir) / "summary.json").read_text(encoding="utf-8"))
    return [NodeSummary(**row) for row in data]


def console_lines(rows: Sequence[NodeSummary]) -> list[str]:
    """One plain line per node for a terminal: held-out before -> after, reward by quarter, peers."""
    out = []
    for r in rows:
        if r.heldout_before is None:
            held = "held-out not evaluated"
        elif r.heldout_after is None:
            held = f"held-out {heldout_cell(r.heldout_before, r.heldout_before_interval)} -> (not evaluated)"
        else:
            held = (f"held-out {heldout_cell(r.heldout_before, r.heldout_before_interval)} -> "
                    f"{heldout_cell(r.heldout_after, r.heldout_after_interval)} at step {r.heldout_after_step}: "
                    f"{change_text(r.heldout_change)}")
        out.append(f"{inert(r.name)}: {held}; reward first quarter {_fmt(r.reward_first_quarter)} -> last quarter "
                   f"{_fmt(r.reward_last_quarter)}; mixed groups {_fmt(r.mixed_groups_mean)}; "
                   f"peer samples used {_fmt(r.peer_samples_used, 0)} (with gradient {_fmt(r.peer_samples_gradient, 0)})"
                   + (f"; its groups gave {gave_text(r.gave)}" if r.gave else ""))
    return out
