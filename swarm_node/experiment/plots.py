"""The grid's plots: per pair, one panel per node and metric (rows: overall held-out accuracy, then the
file's primary metric when it is another one, e.g. accuracy on the node's weak skill), one line per
arm, band = 95% t interval over seeds."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from swarm_node.util.atomic import atomic_write_with
from swarm_node.experiment.primary import metric_key
from swarm_node.experiment.stats import mean_ci


def _curve(runs: dict, key: str) -> tuple[list[int], list[tuple[float, float]]] | None:
    """(steps, [(mean, half width)]) of `key` over the seeds' runs; None when a run lacks it."""
    if not all(key in r.get("curves", {"accuracy": r["acc"]}) for r in runs.values()):
        return None
    steps = min((r["steps"] for r in runs.values()), key=len)
    vals = {s: r.get("curves", {"accuracy": r["acc"]})[key] for s, r in runs.items()}
    return steps, [mean_ci([vals[s][r["steps"].index(st)] for s, r in runs.items()]) for st in steps]


def _arm_runs(data: dict, spec: Any, pair: Any, node: str) -> list[tuple[Any, dict]]:
    """(arm, the node's runs) for the pair's arms; a pair without an isolated arm gets the node's isolated
    runs from another pair (the same runs: `summary.isolated_runs`), drawn first."""
    out = [(arm, data.get(pair.name, {}).get(arm.name, {}).get(node, {})) for arm in spec.pair_arms(pair)]
    if not any(arm.name == "isolated" for arm in spec.pair_arms(pair)):
        iso = next((a for a in spec.arms if a.name == "isolated"), None)
        runs = next((r for p in spec.pairs if node in p.nodes
                     for r in [data.get(p.name, {}).get("isolated", {}).get(node, {})] if r), {})
        if iso is not None and runs:
            out.insert(0, (iso, runs))
    return out


def plot_pair(data: dict, spec: Any, pair: Any, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ["overall"] + ([spec.metrics.primary] if spec.metrics.primary != "overall" else [])
    fig, axes = plt.subplots(len(metrics), len(pair.nodes), figsize=(4.2 * len(pair.nodes), 3.2 * len(metrics)),
                             squeeze=False)
    for row, metric in enumerate(metrics):
        for ax, node in zip(axes[row], pair.nodes, strict=True):
            key = metric_key(spec, node, metric)
            for arm, runs in _arm_runs(data, spec, pair, node):
                curve = _curve(runs, key) if runs and key else None
                if curve is None:
                    continue
                steps, stats = curve
                mean = [m for m, _ in stats]
                half = [0.0 if math.isnan(h) else h for _, h in stats]
                style = "--" if arm.collaboration == "horizontal" else "-"
                line, = ax.plot(steps, mean, style, label=arm.name,
                                lw=2.0 if arm.variant_name in ("isolated", "f-tis") else 1.2)
                ax.fill_between(steps, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)],
                                color=line.get_color(), alpha=0.12)
            ax.set_title(f"{pair.name}: {node}", fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.set_ylabel("held-out accuracy" if key == "accuracy" else f"{key}", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        drawn = [ax for ax in axes[row] if ax.get_legend_handles_labels()[0]]
        if drawn:  # a node without a weak skill has no primary-metric curve
            drawn[-1].legend(fontsize=6, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, dpi=80, format="png"))
    plt.close(fig)


def plot_lags(table: dict, spec: Any, pair: Any, path: Path) -> None:
    """A staleness sweep: per node, the primary metric's paired Δ AUC to isolated (mean, 95% interval over
    seeds) against the arm's peer lag, one line per variant (f-tis, nois, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(pair.nodes), figsize=(4.6 * len(pair.nodes), 3.4), squeeze=False)
    for ax, node in zip(axes[0], pair.nodes, strict=True):
        key = metric_key(spec, node, spec.metrics.primary)
        by_variant: dict[str, list[tuple[int, float, float]]] = {}
        for arm in spec.pair_arms(pair):
            row = table.get(f"{pair.name}|{arm.name}|{node}")
            if arm.isolated or row is None or key not in row.get("d_aucs", {}):
                continue
            mean, half = row["d_aucs"][key]
            by_variant.setdefault(arm.variant_name, []).append((spec.peer_lag(arm), mean, half))
        for i, (variant, points) in enumerate(sorted(by_variant.items())):
            points.sort()
            x = [p[0] + 0.08 * i for p in points]  # side by side where two variants share a lag
            ax.errorbar(x, [p[1] for p in points], yerr=[0.0 if math.isnan(p[2]) else p[2] for p in points],
                        marker="o", capsize=3, label=variant, lw=2.0 if variant == "f-tis" else 1.2)
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xscale("symlog", linthresh=1.0)
        lags = sorted({spec.peer_lag(a) for a in spec.pair_arms(pair) if not a.isolated})
        ax.set_xlim(-0.3, max(lags) * 1.3 + 0.3)
        ax.set_xticks(lags)
        ax.set_xticklabels([str(k) for k in lags])
        ax.set_title(f"{pair.name}: {node}", fontsize=9)
        ax.set_xlabel("peer lag (steps)", fontsize=8)
        ax.set_ylabel(f"Δ AUC vs isolated ({key})", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if by_variant:
            ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, dpi=80, format="png"))
    plt.close(fig)
