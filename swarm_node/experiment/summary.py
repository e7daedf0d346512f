"""Statistics over seeds, the grid's summary (markdown + JSON) and its plots.

First the metrics the experiment file fixed (`[metrics]`, `primary.py`): paired Δ AUC on each node's
weak skill, overall or out of distribution, with which arms' intervals clear 0. Then per pair, arm
and node: final held-out accuracy and area under the accuracy curve (the trapezoid
area divided by the step span: the mean accuracy over the run), each as mean and 95% interval over
seeds (Student t: mean +/- t_{0.975, n-1} * sd / sqrt(n)); the same for the per-seed difference to
the isolated arm (paired by seed, so the shared starting point and prompt order cancel); and from
the nodes' own metrics (`run_metrics`, per run, then the mean over seeds): peer samples that carried
gradient (not filtered, advantage != 0), the fraction of peer samples filtered, the importance
weight pi_theta_old/pi_gen over peers' tokens only, and the per-sample KL to peers by both
estimators (k3_gen and k3_theta, `swarm_node.method.kl`): median of the steps' medians, median of the
steps' 90th percentiles, and the largest value of the run.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swarm_node.util.atomic import atomic_write_text
from swarm_node.experiment.pair_tables import crosstok_lines, fmt_ci, fmt_kl, offer_lines, weight_lines
from swarm_node.experiment.plots import plot_lags, plot_pair
from swarm_node.experiment.primary import contrast_lines, contrast_rows, fixed_metrics
from swarm_node.experiment.stats import curve_auc, mean_ci
from swarm_node.util.machine import describe

def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


KL_ESTIMATORS = ("k3_gen", "k3_theta")
PEER_COLUMNS = ("peer_samples_gradient", "peer_filtered_fraction", "is_weight_peer_mean",
                *(f"kl_{e}_{s}" for e in KL_ESTIMATORS for s in ("p50", "p90", "max")), "train_reward_last5",
                "crosstok_samples", "crosstok_tokens_per_chunk", "step_seconds_p50",
                "is_weight_peer_max", "truncated_peer_fraction", "peer_filtered_advantage_fraction",
                "peer_filtered_kl_fraction")


OFFER_COLUMNS = ("peer_groups_offered", "peer_groups_taken", "peer_cap_bound_steps")


def _median(values: Sequence[float]) -> float:
    vals = sorted(values)
    if not vals:
        return math.nan
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def run_metrics(run_dir: Path, node: str) -> dict[str, float]:
    """Peer-data statistics of one node over one run, from its metrics.jsonl (nan without peers).

    peer_samples_gradient: sum over steps of peer samples that carried gradient; peer_filtered_fraction:
    1 - peer_samples_used / peer_samples over the run; is_weight_peer_mean: the mean importance weight
    over every peer token of the run (steps weighted by their `peer_tokens`); kl_<estimator>_p50 /
    _p90: median over the steps with peers of the step's median / 90th percentile of the per-sample
    KL to peers; kl_<estimator>_max: the run's largest. crosstok_samples: peer samples of another
    tokenizer over the run; crosstok_tokens_per_chunk: own tokens per aligned chunk over them (steps
    weighted by their cross-tokenizer samples; nan without any); step_seconds_p50: the median step time."""
    rows = _read_jsonl(run_dir / node / "metrics.jsonl")
    xtok = [r for r in rows if r.get("crosstok_samples", 0.0) > 0 and "crosstok_tokens_per_chunk" in r]
    xtok_n = sum(r["crosstok_samples"] for r in xtok)
    peer = sum(r.get("peer_samples", 0.0) for r in rows)
    used = sum(r.get("peer_samples_used", 0.0) for r in rows)
    with_peers = [r for r in rows if r.get("peer_samples", 0.0) > 0]
    peer_tokens = sum(r.get("peer_tokens", 0.0) for r in with_peers)
    out = {
        "peer_samples": peer,
        "peer_samples_gradient": sum(r.get("peer_samples_gradient", 0.0) for r in rows),
        "peer_filtered_fraction": 1.0 - used / peer if peer > 0 else math.nan,
        "is_weight_peer_mean": (sum(r.get("is_weight_peer_mean", 0.0) * r.get("peer_tokens", 0.0) for r in with_peers)
                                / peer_tokens if peer_tokens > 0 else math.nan),
        "train_reward_last5": (sum(r.get("reward_mean", 0.0) for r in rows[-5:]) / len(rows[-5:]) if rows else math.nan),
        "crosstok_samples": sum(r.get("crosstok_samples", 0.0) for r in rows),
        "crosstok_tokens_per_chunk": (sum(r["crosstok_tokens_per_chunk"] * r["crosstok_samples"] for r in xtok) / xtok_n
                                      if xtok_n > 0 else math.nan),
        "step_seconds_p50": _median([r["step_seconds"] for r in rows if "step_seconds" in r]),
        # what truncation and the filter did to peers' data: the run's largest weight before truncation,
        # the fraction of peer tokens truncated at C (steps weighted by peer tokens), and the fraction of
        # peer samples that met each filter condition (a sample may meet both; nan when none were scored)
        "is_weight_peer_max": max((r["is_weight_peer_max"] for r in with_peers if "is_weight_peer_max" in r),
                                  default=math.nan),
        "truncated_peer_fraction": (sum(r.get("truncated_peer_fraction", 0.0) * r.get("peer_tokens", 0.0)
                                        for r in with_peers) / peer_tokens
                                    if peer_tokens > 0 and any("truncated_peer_fraction" in r for r in with_peers)
                                    else math.nan),
    }
    scored = [r for r in with_peers if "filtered_kl" in r]
    scored_n = sum(r.get("peer_samples", 0.0) for r in scored)
    for reason, key in (("advantage", "filtered_nonpositive_advantage"), ("kl", "filtered_kl")):
        out[f"peer_filtered_{reason}_fraction"] = (sum(r.get(key, 0.0) for r in scored) / scored_n
                                                   if scored_n > 0 else math.nan)
    for e in KL_ESTIMATORS:
        steps = [r for r in with_peers if f"kl_peer_{e}_p50" in r]
        out[f"kl_{e}_p50"] = _median([r[f"kl_peer_{e}_p50"] for r in steps])
        out[f"kl_{e}_p90"] = _median([r[f"kl_peer_{e}_p90"] for r in steps])
        out[f"kl_{e}_max"] = max((r[f"kl_peer_{e}_max"] for r in steps), default=math.nan)
    return out


def peer_offer(run_dir: Path, node: str, pair_nodes: list[str]) -> dict[str, float]:
    """Whether a peer cap bound in one run (`budget.json` beside the run, absent in older runs: nan):
    peer_groups_offered = the groups the pair's other nodes published (steps x their prompts per step),
    peer_groups_taken = the groups this node trained on (`peer_groups`), peer_cap_bound_steps = steps
    whose taken groups reached the node's cap (`rollouts.peer_group_cap`). taken < offered with no
    bound step: nothing was left out by a cap (the first node of a lockstep round cannot see its
    peers' last step, so its taken is at most (steps - 1) x prompts)."""
    from swarm_node.node.peer_rollouts import peer_group_cap

    path = run_dir / "budget.json"
    nan = {"peer_groups_offered": math.nan, "peer_groups_taken": math.nan, "peer_cap_bound_steps": math.nan}
    if not path.exists():
        return nan
    budget = json.loads(path.read_text())
    me = budget.get(node)
    if me is None or not me["swarm"]:
        return nan
    rows = _read_jsonl(run_dir / node / "metrics.jsonl")
    cap = peer_group_cap(me["prompts_per_step"], me["max_peer_fraction"], me["max_peer_groups_per_step"])
    steps = len(rows)
    offered = sum(steps * budget[o]["prompts_per_step"] for o in pair_nodes if o != node and o in budget)
    return {"peer_groups_offered": float(offered),
            "peer_groups_taken": sum(r.get("peer_groups", 0.0) for r in rows),
            "peer_cap_bound_steps": float(sum(1 for r in rows if r.get("peer_groups", 0.0) >= cap))}


def curves(rows: list[dict], node: str) -> dict[str, tuple[list[int], list[float]]]:
    """{accuracy key: (steps, values)} of one node: `accuracy` and every per-skill / OOD accuracy
    (`evaluation.Evaluator`) present at every evaluation."""
    mine = sorted((r for r in rows if r["node"] == node), key=lambda r: r["step"])
    keys = [k for k in (mine[0] if mine else {}) if "accuracy" in k and all(k in r for r in mine)]
    return {k: ([r["step"] for r in mine], [float(r[k]) for r in mine]) for k in keys}


def collect(out: Path, spec: Any) -> dict[str, Any]:
    """{pair: {arm: {node: {seed: {steps, acc, final, auc, aucs, finals, **run_metrics}}}}} over
    finished runs; `aucs` / `finals` hold every accuracy key's AUC / final value (overall, per skill, OOD)."""
    data: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for pair, arm, seed in spec.runs():
        run_dir = out / "runs" / pair.name / arm.name / f"seed{seed}"
        if not (run_dir / "done.json").exists():
            continue
        rows = _read_jsonl(run_dir / "evals.jsonl")
        for node in pair.nodes:
            by_key = curves(rows, node)
            if "accuracy" not in by_key:
                continue
            steps, acc = by_key["accuracy"]
            data[pair.name][arm.name][node][seed] = {
                "steps": steps, "acc": acc, "final": acc[-1], "auc": curve_auc(steps, acc),
                "aucs": {k: curve_auc(st, v) for k, (st, v) in by_key.items()},
                "curves": {k: v for k, (_, v) in by_key.items()},
                "finals": {k: v[-1] for k, (_, v) in by_key.items()},
                **run_metrics(run_dir, node), **peer_offer(run_dir, node, pair.nodes)}
    return data


def run_machines(out: Path, spec: Any) -> list[dict[str, Any]]:
    """The machines that made the finished runs, most runs first: [{"machine": fingerprint, "runs": n}];
    a run whose done.json has no fingerprint (made before runs recorded one) counts under {}."""
    counts: dict[str, int] = {}
    for pair, arm, seed in spec.runs():
        done = out / "runs" / pair.name / arm.name / f"seed{seed}" / "done.json"
        if not done.exists():
            continue
        try:
            fp = json.loads(done.read_text()).get("machine") or {}
        except (OSError, ValueError, AttributeError):
            fp = {}
        key = json.dumps(fp, sort_keys=True)
        counts[key] = counts.get(key, 0) + 1
    return [{"machine": json.loads(k), "runs": n} for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]


def machine_lines(machines: list[dict[str, Any]]) -> list[str]:
    """The summary's line on which machines made the runs (see swarm_node.util.machine)."""
    if not machines:
        return []
    if len(machines) == 1:
        return [f"Every run ({_runs(machines[0])}) made on one machine: {describe(machines[0]['machine'])}.", ""]
    made = "; ".join(f"{describe(m['machine'])}: {_runs(m)}" for m in machines)
    return [f"Runs made on {len(machines)} machines ({made}). The same seed may sample another trajectory on "
            "another machine: such runs are two samples of the experiment, not copies.", ""]


def _runs(machine: dict[str, Any]) -> str:
    return f"{machine['runs']} run{'' if machine['runs'] == 1 else 's'}"


def isolated_runs(data: dict, pair: Any, node: str, spec: Any) -> dict:
    """The node's isolated runs: of this pair, else of the first pair that ran them (a node's isolated
    run is the same in every pair: same warm model, training seed and prompts)."""
    own = data.get(pair.name, {}).get("isolated", {}).get(node, {})
    if own:
        return own
    for other in spec.pairs:
        runs = data.get(other.name, {}).get("isolated", {}).get(node, {})
        if runs:
            return runs
    return {}


def reference_runs(data: dict, pair: Any, node: str, spec: Any) -> tuple[str, dict] | None:
    """The node's "just more samples" reference runs (an isolated arm with `own_budget` > 1), found like
    `isolated_runs`: (arm name, runs), or None when the file declares no reference."""
    refs = [a.name for a in spec.arms if a.isolated and a.own_budget > 1]
    if not refs:
        return None
    for other in [pair, *spec.pairs]:
        runs = data.get(other.name, {}).get(refs[0], {}).get(node, {})
        if runs:
            return refs[0], runs
    return None


def _paired(runs: dict, base: dict, keys: list[str]) -> dict[str, tuple[float, float]]:
    """Per accuracy key: mean and interval of the per-seed AUC differences `runs` - `base`."""
    seeds = sorted(s for s in runs if s in base)
    return {k: mean_ci([runs[s]["aucs"][k] - base[s]["aucs"][k] for s in seeds if k in base[s].get("aucs", {})])
            for k in keys}


def _finite_mean(values: list[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def summarise(data: dict, spec: Any) -> dict[str, Any]:
    """Per pair/arm/node: intervals of final and AUC, paired differences to `isolated`, peer stats."""
    table: dict = {}
    for pair in spec.pairs:
        for arm in spec.pair_arms(pair):
            for node in pair.nodes:
                runs = data.get(pair.name, {}).get(arm.name, {}).get(node, {})
                if not runs:
                    continue
                iso = isolated_runs(data, pair, node, spec)
                paired = sorted(s for s in runs if s in iso)
                keys = sorted(set.intersection(*(set(r.get("aucs", {})) for r in runs.values())))
                ref = reference_runs(data, pair, node, spec) if not arm.isolated else None
                row = {"seeds": sorted(runs), "paired_seeds": paired,
                       "aucs": {k: mean_ci([r["aucs"][k] for r in runs.values()]) for k in keys},
                       "d_aucs": _paired(runs, iso, keys),
                       **({"reference": ref[0], "d_aucs_reference": _paired(runs, ref[1], keys)} if ref else {}),
                       "final": mean_ci([r["final"] for r in runs.values()]),
                       "auc": mean_ci([r["auc"] for r in runs.values()]),
                       "d_final": mean_ci([runs[s]["final"] - iso[s]["final"] for s in paired]),
                       "d_auc": mean_ci([runs[s]["auc"] - iso[s]["auc"] for s in paired]),
                       **{k: _finite_mean([r.get(k, math.nan) for r in runs.values()])
                          for k in (*PEER_COLUMNS, *OFFER_COLUMNS)}}
                table[f"{pair.name}|{arm.name}|{node}"] = row
    return table


def markdown(table: dict, spec: Any, out: Path, data: dict | None = None) -> str:
    """summary.md; `data`: `collect(out, spec)` when the caller has it (else it is read again)."""
    data = collect(out, spec) if data is None else data
    e = spec.experiment
    split = "held-out" if spec.eval.split == "heldout" else "validation"
    lines = [f"# {e.name}: {split} accuracy, mean ± 95% interval over seeds", "",
             f"seeds {e.seeds}, {e.steps} steps, {split}: {spec.eval.problems} problems greedy pass@1 every "
             f"{spec.eval.every} steps; Δ = paired difference to the isolated arm (same seed). "
             "AUC = mean accuracy over the curve. peer grad = peer samples that carried gradient per run "
             "(not filtered, advantage ≠ 0); filtered = fraction of peer samples filtered; IS peer = mean "
             "pi_theta_old/pi_gen over peers' tokens. KL to peers per run (mean over seeds): median of the "
             "steps' medians (p50), median of the steps' 90th percentiles (p90), largest value (max), by the "
             "k3_gen estimator (of KL(pi_gen || pi_theta), unbiased on peers' samples) and the k3_theta form.", ""]
    lines += machine_lines(run_machines(out, spec))
    lines += fixed_metrics(table, spec)[1]
    lines += contrast_lines(contrast_rows(data, spec))
    lines += starting_lines(data, spec)[1]
    for pair in spec.pairs:
        if not any(key.startswith(f"{pair.name}|") for key in table):
            continue  # a pair with no finished run (not run yet, or not chosen)
        lines += [f"## {pair.name}: {' + '.join(pair.nodes)}", "", f"![{pair.name}](plots/{pair.name}.png)", "",
                  "| arm | node | final | AUC | Δ final | Δ AUC | peer grad | filtered | IS peer | n |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        kl_lines = ["| arm | node | k3_gen p50 | k3_gen p90 | k3_gen max | k3_theta p50 | k3_theta p90 | k3_theta max |",
                    "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for arm in spec.pair_arms(pair):
            for node in pair.nodes:
                row = table.get(f"{pair.name}|{arm.name}|{node}")
                if row is None:
                    continue
                iso = arm.name == "isolated"
                lines.append(
                    f"| {arm.name} | {node} | {fmt_ci(*row['final'])} | {fmt_ci(*row['auc'])} | "
                    f"{'' if iso else fmt_ci(*row['d_final'])} | {'' if iso else fmt_ci(*row['d_auc'])} | "
                    f"{'' if iso else fmt_ci(row['peer_samples_gradient'], math.nan, 0)} | "
                    f"{'' if iso else fmt_ci(row['peer_filtered_fraction'], math.nan, 2)} | "
                    f"{'' if iso else fmt_ci(row['is_weight_peer_mean'], math.nan, 2)} | {len(row['seeds'])} |")
                if not iso:
                    kl_lines.append(f"| {arm.name} | {node} | " + " | ".join(
                        fmt_kl(row[f"kl_{est}_{stat}"]) for est in KL_ESTIMATORS for stat in ("p50", "p90", "max")) + " |")
        lines.append("")
        if len(kl_lines) > 2:
            lines += [f"Per-sample KL to peers ({pair.name}):", "", *kl_lines, ""]
        lines += offer_lines(table, spec, pair) + crosstok_lines(table, spec, pair) + weight_lines(table, spec, pair)
    return "\n".join(lines)


def starting_lines(data: dict, spec: Any) -> tuple[dict[str, Any], list[str]]:
    """Each node's held-out accuracy at step 0 (its warm model; mean and interval over seeds), overall
    and on its weak skill, read from its isolated runs: whether nodes of different tokenizers or sizes
    start level."""
    out: dict[str, Any] = {}
    for node in spec.nodes:
        runs = next((runs for pair in spec.pairs if node.name in pair.nodes
                     for runs in [isolated_runs(data, pair, node.name, spec)] if runs), {})
        if not runs:
            continue
        weak = f"accuracy_{node.weak_skill}" if node.weak_skill else None
        out[node.name] = {"seeds": sorted(runs), "overall": mean_ci([r["acc"][0] for r in runs.values()]),
                          **({"weak": mean_ci([r["curves"][weak][0] for r in runs.values() if weak in r.get("curves", {})])}
                             if weak else {}),
                          "isolated_final_weak": (mean_ci([r["finals"][weak] for r in runs.values() if weak in r.get("finals", {})])
                                                  if weak else (math.nan, math.nan))}
    if not out:
        return out, []
    lines = ["## Starting points", "", "Held-out accuracy of each node's warm model at step 0, and its weak skill at "
             "the last step of its isolated run (mean ± 95% interval over seeds):", "",
             "| node | model | step-0 overall | step-0 weak skill | isolated, last step, weak skill | n |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, row in out.items():
        node = spec.node(name)
        base = (node.warmup or {}).get("base", node.model)
        lines.append(f"| {name} | {base} | {fmt_ci(*row['overall'])} | {fmt_ci(*row.get('weak', (math.nan, math.nan)))} | "
                     f"{fmt_ci(*row['isolated_final_weak'])} | {len(row['seeds'])} |")
    return out, lines + [""]


def write_summary(out: Path, spec: Any) -> dict[str, Any]:
    data = collect(out, spec)
    table = summarise(data, spec)
    fixed, _ = fixed_metrics(table, spec)
    contrasts = contrast_rows(data, spec)
    starting, _ = starting_lines(data, spec)
    record = {"metrics": fixed, "contrasts": contrasts, "starting": starting, "table": table, "runs": data,
              "machines": run_machines(out, spec)}
    atomic_write_text(out / "summary.json", json.dumps(record, indent=1, default=str))
    atomic_write_text(out / "summary.md", markdown(table, spec, out, data))
    for pair in spec.pairs:
        if data.get(pair.name):
            plot_pair(data, spec, pair, out / "plots" / f"{pair.name}.png")
            if len({spec.peer_lag(a) for a in spec.pair_arms(pair) if not a.isolated}) > 1:
                plot_lags(table, spec, pair, out / "plots" / f"{pair.name}_lag.png")
    return table
