"""The soak's plots, one per series, from its run directory: `plot_run(run_dir, summary, out_dir)`."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.soak.sampling import metrics_rows, read_jsonl


def _events(ax: Any, events: list[dict[str, Any]], t0: float) -> None:
    colours = {"kill": "red", "freeze": "purple", "cut": "orange", "late_join": "green", "end_prompt_set": "brown"}
    for e in events:
        if e["kind"] in colours:
            ax.axvline((e["time"] - t0) / 60, color=colours[e["kind"]], alpha=0.35, lw=1)


def plot_run(run_dir: Path, summary: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    events = read_jsonl(run_dir / "events.jsonl")
    t0 = next(e["time"] for e in events if e["kind"] == "bootstrap")
    names = list(summary["nodes"])
    paths = []

    def save(fig: Any, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(9, 4.5))  # steps over time
    for name in names:
        rows = metrics_rows(run_dir / name)
        ax.plot([(r["time"] - t0) / 60 for r in rows], [r["step"] for r in rows], label=name, lw=1)
    _events(ax, events, t0)
    ax.set(xlabel="minute", ylabel="step", title="Steps (red: kill, purple: freeze, orange: cut, green: late join, brown: set ended)")
    ax.legend(fontsize=6, ncol=2)
    save(fig, "soak_steps.png")

    fig, ax = plt.subplots(figsize=(9, 4.5))  # fraction of steps with a peer group, per 5 minutes
    for name in names:
        rows = metrics_rows(run_dir / name)[3:]
        bins: dict[int, list[int]] = defaultdict(list)
        for r in rows:
            bins[int((r["time"] - t0) // 300)].append(r.get("peer_groups", 0) > 0)
        xs = sorted(bins)
        ax.plot([5 * x + 2.5 for x in xs], [sum(bins[x]) / len(bins[x]) for x in xs], marker=".", label=name, lw=1)
    _events(ax, events, t0)
    ax.axhline(0.9, color="k", ls="--", lw=0.8)
    ax.set(xlabel="minute", ylabel="share of steps", ylim=(0, 1.05), title="Steps that took at least one peer group (5-minute bins)")
    ax.legend(fontsize=6, ncol=2)
    save(fig, "soak_peer_groups.png")

    samples = read_jsonl(run_dir / "samples.jsonl")
    fig, ax = plt.subplots(figsize=(9, 4.5))  # RSS over time
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        by_name[s["name"]].append(s)
    for name, rows in by_name.items():
        ax.plot([(s["time"] - t0) / 60 for s in rows], [s["rss_kib"] / 1024 for s in rows], label=name, lw=1)
    _events(ax, events, t0)
    ax.set(xlabel="minute", ylabel="MiB (process tree)", title="Resident memory per process tree")
    ax.legend(fontsize=6, ncol=2)
    save(fig, "soak_rss.png")

    fig, ax = plt.subplots(figsize=(9, 4))  # fairness: shares of taken groups
    for label in ("light", "training"):
        shares = summary["fairness"].get(label, {}).get("shares", [])
        if shares:
            ax.plot(range(1, len(shares) + 1), shares, marker="o", ms=3, label=f"{label} senders")
            ax.axhline(3 / len(shares), ls=":", lw=0.8, color="C0" if label == "light" else "C1")
    ax.set(xlabel="sender (by share)", ylabel="share of taken groups", title="Fairness: each sender's share (dotted: 3x the mean)")
    ax.legend()
    save(fig, "soak_fairness.png")

    fig, ax = plt.subplots(figsize=(9, 4))  # bytes per step against the scale model
    nodes = [(n, v) for n, v in summary["nodes"].items() if v.get("daemon_bytes_per_step")]
    ax.bar([n for n, _ in nodes], [v["daemon_bytes_per_step"] / 1e3 for _, v in nodes], label="measured (p2p daemon I/O / 2)")
    predicted = [v.get("scale_model_bytes_per_step", summary["scale_model"]["bytes_per_node_round"]) / 1e3
                 for _, v in nodes]
    ax.scatter([n for n, _ in nodes], predicted, color="k", marker="_", s=400, zorder=3,
               label="benchmarks.scale prediction at the node's step rate")
    ax.set(yscale="log", ylabel="kB per step", title=f"Network bytes per node and step at {summary['peers']['total']} peers")
    ax.tick_params(axis="x", rotation=45, labelsize=7)
    ax.legend()
    save(fig, "soak_bytes.png")

    rec = [r for r in summary["recoveries"] if r["to_first_peer_group_s"] is not None]
    if rec:
        fig, ax = plt.subplots(figsize=(9, 4))  # recovery times
        labels = [f"{r['event']}\n{r['node']}" for r in rec]
        ax.bar(labels, [r["to_first_peer_group_s"] for r in rec], label="to first peer group taken")
        ax.bar(labels, [r["to_first_group_taken_s"] or 0 for r in rec], alpha=0.5, label="to first of its groups taken")
        ax.axhline(60, color="k", ls="--", lw=0.8, label="two windows")
        ax.set(ylabel="seconds", title="Recovery after each restart, thaw, reconnect and the late join")
        ax.tick_params(axis="x", labelsize=6)
        ax.legend(fontsize=7)
        save(fig, "soak_recovery.png")
    return paths
