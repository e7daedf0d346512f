"""The experiment file's fixed metrics (`[metrics]`), read from the summary table and shown first.

Each metric is, per pair, arm and node, the paired (by seed) difference of an AUC to the node's
isolated arm, mean and 95% Student-t interval over seeds (`summary.summarise`'s `d_aucs`):

    weak_skill   AUC of held-out accuracy on the node's `weak_skill` problems (`accuracy_<skill>`)
    overall      AUC of held-out accuracy on the whole set (`accuracy`)
    ood          AUC of accuracy on the out-of-distribution set (`ood_accuracy`)

An interval "clears 0" when its lower end is above 0 (gain) or its upper end below 0 (loss); a
single seed (no interval) clears nothing.

When the file declares a "just more samples" reference (an isolated arm with `own_budget` > 1, such as
`isolated-2x`), each metric also gets the swarm arms' paired Δ AUC to that reference
(`d_aucs_reference`): above 0, the peers gave a node more than twice its own samples would have;
level or below, the gain over isolated is no more than more samples give.

The file's contrasts (`metrics.contrasts`, "PAIR/ARM - PAIR/ARM") are paired by seed the same way,
for each node the two pairs share (`contrast_rows`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

Metric = Literal["weak_skill", "overall", "ood"]
LABELS = {"weak_skill": "Δ AUC on the node's weak skill", "overall": "Δ AUC overall (whole held-out set)",
          "ood": "Δ AUC out of distribution"}


def metric_key(spec: Any, node: str, metric: Metric) -> str | None:
    """The evals.jsonl accuracy key a metric reads for `node` (None: the node has no weak skill)."""
    if metric == "overall":
        return "accuracy"
    if metric == "ood":
        return "ood_accuracy"
    weak = spec.node(node).weak_skill
    return None if weak is None else f"accuracy_{weak}"


def verdict(mean: float, half: float) -> str:
    """'gain' / 'loss' when the 95% interval lies above / below 0, else 'no' ('-' without an interval)."""
    if math.isnan(mean) or math.isnan(half):
        return "-"
    if mean - half > 0:
        return "gain"
    if mean + half < 0:
        return "loss"
    return "no"


def metric_rows(table: dict, spec: Any, metric: Metric) -> list[dict[str, Any]]:
    """One row per (pair, swarm or reference arm, node) with the metric's paired Δ AUC and verdict."""
    out = []
    for pair in spec.pairs:
        for arm in spec.pair_arms(pair):
            if arm.name == "isolated":
                continue
            for node in pair.nodes:
                row, key = table.get(f"{pair.name}|{arm.name}|{node}"), metric_key(spec, node, metric)
                if row is None or key is None or key not in row.get("d_aucs", {}):
                    continue
                mean, half = row["d_aucs"][key]
                out.append({"pair": pair.name, "arm": arm.name, "own_budget": arm.own_budget, "node": node,
                            "key": key, "d_auc": mean,
                            "half": half, "auc": row["aucs"][key][0],
                            "n": len(row.get("paired_seeds", row["seeds"])),  # the seeds Δ is over
                            "verdict": verdict(mean, half)})
                if key in row.get("d_aucs_reference", {}):
                    ref_mean, ref_half = row["d_aucs_reference"][key]
                    out[-1].update(reference=row["reference"], d_auc_reference=ref_mean, half_reference=ref_half,
                                   verdict_reference=verdict(ref_mean, ref_half))
    return out


def _fmt(m: float, h: float) -> str:
    if math.isnan(m):
        return "-"
    return f"{m:+.3f}" if math.isnan(h) else f"{m:+.3f} ± {h:.3f}"


def metric_markdown(rows: list[dict[str, Any]], metric: Metric, primary: bool) -> list[str]:
    title = f"{'Primary' if primary else 'Secondary'}: {LABELS[metric]}"
    lines = [f"## {title}", "", "Own budget: own-generation budget relative to the isolated arm (every swarm arm 1x; "
             "isolated-2x: twice the own prompts per step, no peers).", "",
             "| pair | arm | own budget | node | metric | AUC | Δ AUC vs isolated | clears 0 | n |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['pair']} | {r['arm']} | {r['own_budget']}x | {r['node']} | {r['key']} | {r['auc']:.3f} | "
              f"{_fmt(r['d_auc'], r['half'])} | {r['verdict']} | {r['n']} |" for r in rows]
    gains = [f"{r['pair']}/{r['arm']}/{r['node']}" for r in rows if r["verdict"] == "gain"]
    losses = [f"{r['pair']}/{r['arm']}/{r['node']}" for r in rows if r["verdict"] == "loss"]
    lines += ["", f"Intervals above 0: {', '.join(gains) or 'none'}. Below 0: {', '.join(losses) or 'none'}.", ""]
    return lines + reference_markdown(rows)


def reference_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The swarm arms against the "just more samples" reference (none without one)."""
    rows = [r for r in rows if "reference" in r]
    if not rows:
        return []
    ref = rows[0]["reference"]
    lines = [f"Swarm arms against `{ref}` (more own samples, no peers), paired by seed: above 0, peers gave the node "
             "more than the reference's extra own samples did.", "",
             f"| pair | arm | node | Δ AUC vs {ref} | clears 0 | n |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['pair']} | {r['arm']} | {r['node']} | {_fmt(r['d_auc_reference'], r['half_reference'])} | "
              f"{r['verdict_reference']} | {r['n']} |" for r in rows]
    return lines + [""]


def fixed_metrics(table: dict, spec: Any) -> tuple[dict[str, Any], list[str]]:
    """({"primary": {metric, rows}, "secondary": [...]}, markdown lines): primary first."""
    m = spec.metrics
    primary = {"metric": m.primary, "rows": metric_rows(table, spec, m.primary)}
    secondary = [{"metric": s, "rows": metric_rows(table, spec, s)} for s in m.secondary]
    lines = metric_markdown(primary["rows"], m.primary, True)
    if m.note:
        lines[1:1] = ["", f"Fixed before the grid ran: {m.note}"]
    for s in secondary:
        lines += metric_markdown(s["rows"], s["metric"], False)
    return {"primary": primary, "secondary": secondary}, lines


def contrast_rows(data: dict, spec: Any) -> list[dict[str, Any]]:
    """The file's contrasts (`metrics.contrasts`): per contrast, shared node and metric, the paired Δ AUC."""
    from swarm_node.experiment.compare import paired_delta
    from swarm_node.experiment.spec import parse_contrast

    out = []
    pairs = {p.name: p for p in spec.pairs}
    for text in spec.metrics.contrasts:
        (pa, aa), (pb, ab) = parse_contrast(text)
        shared = [n for n in pairs[pa].nodes if n in pairs[pb].nodes]
        for metric in (spec.metrics.primary, *spec.metrics.secondary):
            for node in shared:
                key = metric_key(spec, node, metric)
                if key is None:
                    continue
                try:
                    mean, half, n = paired_delta(data, f"{pa}/{aa}", f"{pb}/{ab}", node, key)
                except ValueError:
                    continue
                out.append({"contrast": text, "node": node, "metric": metric, "key": key, "d_auc": mean,
                            "half": half, "n": n, "verdict": verdict(mean, half)})
    return out


def contrast_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["## Contrasts fixed in the file", "", "Paired by seed, the same node in both arms: Δ AUC of the first "
             "arm minus the second.", "", "| contrast | node | metric | Δ AUC | clears 0 | n |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['contrast']} | {r['node']} | {r['key']} | {_fmt(r['d_auc'], r['half'])} | {r['verdict']} | "
              f"{r['n']} |" for r in rows]
    return lines + [""]
