"""Per-pair tables of a grid's summary.md beyond accuracy (`summary.markdown` places them under each
pair): what truncation and the KL filter did per arm and lag (`weight_lines`), peer samples of another
tokenizer (`crosstok_lines`) and whether a peer cap bound (`offer_lines`). Each reads the rows of
`summary.summarise` (per pair, arm and node; per run, mean over seeds) and returns markdown lines, none
for a pair with nothing to show."""

from __future__ import annotations

import math
from typing import Any


def fmt_ci(m: float, h: float, digits: int = 3) -> str:
    if math.isnan(m):
        return "-"
    return f"{m:.{digits}f}" if math.isnan(h) else f"{m:.{digits}f} ± {h:.{digits}f}"


def fmt_kl(v: float) -> str:
    """A KL value for a table: three significant digits, '-' for nan."""
    return "-" if math.isnan(v) else f"{v:.3g}"


def weight_lines(table: dict, spec: Any, pair: Any) -> list[str]:
    """What truncation and the KL filter did to peers' data per swarm arm (per run, mean over seeds), with
    the arm's peer lag: which of the two carries a gain can be read across arms (a staleness sweep)."""
    rows = []
    for arm in spec.pair_arms(pair):
        for node in pair.nodes:
            row = table.get(f"{pair.name}|{arm.name}|{node}")
            if row is None or arm.isolated:
                continue
            filtered = arm.filter == "on"  # the objective counts the conditions only where the filter applies
            adv, kl = (row["peer_filtered_advantage_fraction"], row["peer_filtered_kl_fraction"]) if filtered \
                else (math.nan, math.nan)
            rows.append(f"| {arm.name} | {spec.peer_lag(arm)} | {node} | {fmt_ci(row['is_weight_peer_mean'], math.nan, 3)} | "
                        f"{fmt_kl(row['is_weight_peer_max'])} | {fmt_ci(row['truncated_peer_fraction'], math.nan, 4)} | "
                        f"{fmt_ci(adv, math.nan, 3)} | {fmt_ci(kl, math.nan, 4)} | {fmt_ci(row['peer_groups_taken'], math.nan, 0)} |")
    if not rows:
        return []
    return [f"Importance weights and the filter ({pair.name}; per run, mean over seeds): lag = steps a peer group "
            "waits before its receiver can take it; IS mean / max = pi_theta_old/pi_gen over peers' tokens before "
            "truncation (the max is the largest of any run's steps); truncated = peer tokens whose weight was cut "
            "at C; A <= 0 / KL > g = peer samples that met each filter condition (a sample may meet both; "
            "'-' when the arm has no filter); groups = peer groups taken:", "",
            "| arm | lag | node | IS mean | IS max | truncated | A <= 0 | KL > g | groups |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |", *rows, ""]


def crosstok_lines(table: dict, spec: Any, pair: Any) -> list[str]:
    """Peer samples of another tokenizer and step time (per run, mean over seeds), for a pair whose
    nodes took any."""
    rows = []
    for arm in spec.pair_arms(pair):
        for node in pair.nodes:
            row = table.get(f"{pair.name}|{arm.name}|{node}")
            if row is not None and not arm.isolated:
                rows.append(f"| {arm.name} | {node} | {fmt_ci(row['crosstok_samples'], math.nan, 1)} | "
                            f"{fmt_ci(row['crosstok_tokens_per_chunk'], math.nan, 2)} | {fmt_ci(row['step_seconds_p50'], math.nan, 2)} |")
    if not any(table.get(f"{pair.name}|{a.name}|{n}", {}).get("crosstok_samples", 0.0) > 0
               for a in spec.pair_arms(pair) for n in pair.nodes):
        return []
    return [f"Peer samples of another tokenizer per run ({pair.name}, mean over seeds): samples, own tokens per "
            "aligned chunk over them, median step seconds:", "",
            "| arm | node | cross-tokenizer samples | own tokens per chunk | step s |", "| --- | --- | --- | --- | --- |",
            *rows, ""]


def offer_lines(table: dict, spec: Any, pair: Any) -> list[str]:
    """Whether a peer cap bound (`peer_offer`, per run, mean over seeds), for the swarm arms of a pair."""
    rows = []
    for arm in spec.pair_arms(pair):
        for node in pair.nodes:
            row = table.get(f"{pair.name}|{arm.name}|{node}")
            if row is None or math.isnan(row.get("peer_groups_offered", math.nan)):
                continue
            rows.append(f"| {arm.name} | {node} | {row['peer_groups_offered']:.1f} | {row['peer_groups_taken']:.1f} | "
                        f"{row['peer_cap_bound_steps']:.1f} |")
    if not rows:
        return []
    return [f"Peer groups per run ({pair.name}, mean over seeds): offered = published by the pair's other nodes, "
            "taken = trained on, cap-bound steps = steps whose taken groups reached the node's cap (0: no cap bound):",
            "", "| arm | node | offered | taken | cap-bound steps |", "| --- | --- | --- | --- | --- |", *rows, ""]
