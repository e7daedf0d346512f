"""`swarm-node report RUN_DIR`: PNG plots and a markdown summary from the nodes' metrics logs.

A run directory holds one directory per node, each with a `metrics.jsonl` (at any depth; a
node directory passed on its own works too). The report goes next to them:

    RUN_DIR/report/summary.md       per-node table + links to the plots
    RUN_DIR/report/summary.json     the same numbers, one object per node
    RUN_DIR/report/<plot>.png       reward, accuracy, filtered fraction, KL, importance weights,
                                    held-out accuracy before and after (when the nodes evaluated)

Each node's log is read as its last run of each step (`metrics.latest_run`): rows of steps a
resumed node ran again are superseded by the new ones, so no step counts twice.

Numbers in the table (pure functions below, so tests can check them by hand):
  steps                number of step records
  reward first/last    mean of `reward_mean` over the first / last `window` records that have it
  reward quarters      mean of `reward_mean` over the first / last quarter of the records (at least one)
  mixed groups         mean of `mixed_groups`: share of own groups whose rewards differ
  held-out before/after  accuracy of the node's step-0 evaluation and of its last later one
                       (`evals.jsonl` beside the metrics, see heldout_eval.py)
  peer gradient        sum of `peer_samples_gradient`: peer samples that carried gradient
  accuracy last        mean of `accuracy` over the last `window` records
  eval accuracy        the last `eval_accuracy` seen (blank when no evaluation ran)
  own / peer used      sums of `own_samples` / `peer_samples_used` over the run
  filtered             mean of `filtered_fraction`
  drops                sums of `dropped_<reason>` per reason
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from swarm_node import metrics as m
from swarm_node.atomic import atomic_write_text
from swarm_node.errors import InputError
from swarm_node.heldout_eval import read_evals

METRICS_FILE = "metrics.jsonl"

# plot file stem -> (title, y label, [(metric, line label, line style)])
PLOTS: dict[str, tuple[str, str, list[tuple[str, str, str]]]] = {
    "reward": ("Reward (mean over own samples)", "reward", [(m.REWARD_MEAN, "", "-")]),
    "accuracy": ("Accuracy", "accuracy", [(m.ACCURACY, "train", "-"), (m.EVAL_ACCURACY, "eval", "--")]),
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
    evaluation rows (heldout_eval.read_evals)."""
    from swarm_node.heldout_eval import before_after

    if window < 1:
        raise ValueError("window must be >= 1")
    rewards = _series(records, m.REWARD_MEAN)
    quarter = max(1, len(rewards) // 4)
    before, after = before_after(list(evals))
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
    held = f"held-out ({n}) before | after" if n else "held-out before | after"
    head = (f"| node | steps | {held} | reward first quarter | reward last quarter | mixed groups | "
            f"accuracy last {window} | own samples | peer samples used | peer samples with gradient | "
            "filtered fraction (mean) | drops by reason |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        drops = ", ".join(f"{k}: {int(v)}" for k, v in r.drops.items()) or "none"
        lines.append(
            f"| {r.name} | {r.steps} | {_fmt(r.heldout_before)} | {_fmt(r.heldout_after)} | "
            f"{_fmt(r.reward_first_quarter)} | {_fmt(r.reward_last_quarter)} | {_fmt(r.mixed_groups_mean)} | "
            f"{_fmt(r.accuracy_last)} | {_fmt(r.own_samples, 0)} | {_fmt(r.peer_samples_used, 0)} | "
            f"{_fmt(r.peer_samples_gradient, 0)} | {_fmt(r.filtered_fraction_mean)} | {drops} |"
        )
    return "\n".join(lines)


def _save(fig, ax, path: Path) -> None:
    """Legend, layout, PNG: the last steps of every plot."""
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")


def plot_heldout(path: Path, rows: Sequence[NodeSummary]) -> bool:
    """Held-out accuracy before and after, one pair of bars per node; False (no file) without evaluations."""
    shown = [r for r in rows if r.heldout_before is not None]
    if not shown:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    try:
        xs = range(len(shown))
        ax.bar([x - 0.2 for x in xs], [r.heldout_before for r in shown], 0.4, label="before step 1", color="C7")
        ax.bar([x + 0.2 for x in xs], [r.heldout_after or 0.0 for r in shown], 0.4, label="after the last step",
               color="C0")
        ax.set_xticks(list(xs), [r.name for r in shown])
        n = shown[0].heldout_n
        ax.set(title=f"Held-out accuracy (greedy pass@1, {n} problems)", ylabel="accuracy", ylim=(0, 1))
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
    runs = {name: m.latest_run(m.read_metrics_jsonl(path)) for name, path in files.items()}
    rows = [summarize(name, records, window, read_evals(files[name].parent)) for name, records in runs.items()]
    _write_summary_json(out, rows)
    plotted = [stem for stem, spec in PLOTS.items() if plot_metric(out / f"{stem}.png", runs, spec)]
    if plot_heldout(out / "heldout.png", rows):
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
        held = (f"held-out {_fmt(r.heldout_before)} -> {_fmt(r.heldout_after) or '(not evaluated)'}"
                if r.heldout_before is not None else "held-out not evaluated")
        out.append(f"{r.name}: {held}; reward first quarter {_fmt(r.reward_first_quarter)} -> last quarter "
                   f"{_fmt(r.reward_last_quarter)}; mixed groups {_fmt(r.mixed_groups_mean)}; "
                   f"peer samples with gradient {_fmt(r.peer_samples_gradient, 0)}")
    return out
