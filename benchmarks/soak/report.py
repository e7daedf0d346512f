"""The soak's measurements, read from its run directory (see `run.py` for what each file holds).

`summarise` returns the JSON object the benchmark prints; `goals` holds each goal of the soak next
to what was measured. Node times are DHT times, which on one machine are wall-clock times.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.soak.plan import (MAX_GROUPS_PER_PEER, MAX_PEER_GROUPS, PROMPTS_PER_STEP, STALENESS, WINDOW_S,
                                  SoakPlan)
from benchmarks.soak.ledgers import exclusions, fairness, given_agreement
from benchmarks.soak.sampling import metrics_rows, read_jsonl

RECOVERY_KINDS = ("restart", "supervised_restart", "thaw", "reconnect", "late_join")


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (time s, value) in value per hour."""
    if len(points) < 3:
        return 0.0
    ts, vs = [p[0] for p in points], [p[1] for p in points]
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    den = sum((t - mt) ** 2 for t in ts)
    return 3600 * sum((t - mt) * (v - mv) for t, v in zip(ts, vs)) / den if den else 0.0


def peer_ids(run_dir: Path, plan: SoakPlan) -> dict[str, str]:
    """peer id -> node name, for the training nodes that started."""
    from swarm_node.swarm.identity import IDENTITY_FILENAME, load_or_create_key

    out = {}
    for n in plan.nodes:
        key = run_dir / n.name / IDENTITY_FILENAME
        if key.exists():
            out[load_or_create_key(key).peer_id] = n.name
    return out


def light_ids(run_dir: Path) -> set[str]:
    return {r["peer"] for path in sorted((run_dir / "light").glob("light-*.jsonl")) for r in read_jsonl(path)}


def switch_spans(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(start, end) of each prompt-set switch, swarm-wide: from the old set's end to two windows
    after it. Peers follow the successor at their own next read of the set (light peers every window,
    nodes at their next check), so for up to a window some publish on the old set and some on the new,
    and each drops the other's groups as `unknown_prompt`."""
    return [(e["time"], e["time"] + 2 * WINDOW_S) for e in events if e["kind"] == "end_prompt_set"]


def outage_spans(events: list[dict[str, Any]], name: str) -> list[tuple[float, float]]:
    """(start, end) of the node's freezes and cuts, each extended by two windows after it ends."""
    spans, began = [], None
    for e in events:
        if e.get("node") != name:
            continue
        if e["kind"] in ("freeze", "cut"):
            began = e["time"]
        elif e["kind"] in ("thaw", "reconnect") and began is not None:
            spans.append((began, e["time"] + 2 * WINDOW_S))
            began = None
    return spans


def node_summary(run_dir: Path, name: str, samples: list[dict[str, Any]],
                 outages: list[tuple[float, float]] = (),
                 switches: list[tuple[float, float]] = ()) -> dict[str, Any]:
    rows = metrics_rows(run_dir / name)
    if not rows:
        return {"steps": 0}
    minutes = (rows[-1]["time"] - rows[0]["time"]) / 60 if len(rows) > 1 else 0.0
    after = rows[3:]
    took = [r for r in after if r.get("peer_groups", 0) > 0]
    # steps of the node's own outage (frozen or cut off, and the two windows after) cannot take peers;
    # steps in a prompt-set switch are counted apart (the swarm is on two sets for up to a window)
    in_switch = [r for r in after if any(a <= r["time"] <= b for a, b in switches)]
    outside = [r for r in after if not any(a <= r["time"] <= b for a, b in (*outages, *switches))]
    took_outside = [r for r in outside if r.get("peer_groups", 0) > 0]
    mine = [s for s in samples if s["name"] == name]
    # RSS growth over the longest stretch of one process, from its 5th minute and its 3rd step
    # (after start-up: model load, first evaluation, optimizer state).
    by_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in mine:
        by_pid[s["pid"]].append(s)
    longest = max(by_pid.values(), key=lambda v: v[-1]["time"] - v[0]["time"]) if by_pid else []
    third = next((r["time"] for r in rows[2:] if longest and r["time"] >= longest[0]["time"]), None)
    settled = [s for s in longest if s["time"] - longest[0]["time"] >= 300
               and (third is None or s["time"] >= third)] or longest
    rss = [(s["time"], s["rss_kib"] / 1024) for s in settled]
    slope = slope_per_hour(rss)
    mean_rss = statistics.fmean(v for _, v in rss) if rss else 0.0
    io = [(s["time"], s["daemon_io"]) for s in longest if s["daemon_io"] > 0]
    steps_in = [r for r in rows if io and io[0][0] <= r["time"] <= io[-1][0]]
    daemon_bytes_per_step = ((io[-1][1] - io[0][1]) / 2 / max(1, len(steps_in))) if len(io) > 1 and steps_in else None
    io_windows = (io[-1][0] - io[0][0]) / WINDOW_S if len(io) > 1 else 0.0

    def mean(key: str) -> float:
        return round(statistics.fmean(r.get(key, 0.0) for r in rows), 3)

    return {
        "steps": len(rows), "last_step": int(rows[-1]["step"]),
        "steps_per_minute": round(len(rows) / minutes, 2) if minutes else None,
        "took_peer_group_fraction": round(len(took) / len(after), 3) if after else None,
        "took_peer_group_fraction_outside_outages": round(len(took_outside) / len(outside), 3) if outside else None,
        "switch_steps": len(in_switch),
        "switch_steps_without_peer_group": sum(1 for r in in_switch if not r.get("peer_groups", 0)),
        "peer_samples_gradient_per_step": mean("peer_samples_gradient"),
        "peer_groups_per_step": mean("peer_groups"),
        "rss_mib_start": round(rss[0][1]) if rss else None, "rss_mib_end": round(rss[-1][1]) if rss else None,
        "rss_growth_per_hour": round(slope / mean_rss, 4) if mean_rss else None,
        "rss_span_minutes": round((longest[-1]["time"] - longest[0]["time"]) / 60, 1) if longest else 0,
        "payload_bytes_per_step": round(statistics.fmean(r.get("bytes_sent", 0) + r.get("bytes_received", 0)
                                                         for r in rows)),
        "daemon_bytes_per_step": round(daemon_bytes_per_step) if daemon_bytes_per_step else None,
        "daemon_steps_per_window": round(len(steps_in) / io_windows, 3) if io_windows > 0 and steps_in else None,
        "index_read_failures_per_step": mean("index_read_failures"),
        "store_failures_per_step": mean("store_failures"),
        "gen_seconds_mean": mean("gen_seconds"), "step_seconds_mean": mean("step_seconds"),
        "drops": {k[len("total_dropped_"):]: v for k, v in rows[-1].items() if k.startswith("total_dropped_") and v},
    }


def recoveries(run_dir: Path, events: list[dict[str, Any]], ids: dict[str, str],
               light_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each restart, thaw, reconnect and late join: seconds to the node's first step that took
    a peer group, and to the first gather of another peer that took a group the node made after the
    event (the light peers log the sender and creation time of every group they take)."""
    name_to_id = {v: k for k, v in ids.items()}
    out = []
    for e in events:
        if e["kind"] not in RECOVERY_KINDS:
            continue
        name, t0 = e["node"], e["time"]
        rows = [r for r in metrics_rows(run_dir / name) if r["time"] > t0]
        first = next((r["time"] for r in rows if r.get("peer_groups", 0) > 0), None)
        first_step = rows[0]["time"] if rows else None
        pid = name_to_id.get(name)
        taken_at = min((r["time"] for r in light_rows for sender, created in r.get("taken", ())
                        if sender == pid and created > t0), default=None)
        out.append({"event": e["kind"], "node": name, "minute": e["minute"],
                    "to_first_step_s": round(first_step - t0, 1) if first_step else None,
                    "to_first_peer_group_s": round(first - t0, 1) if first else None,
                    "to_first_group_taken_s": round(taken_at - t0, 1) if taken_at else None})
    return out


def checkpoints_after_kills(run_dir: Path, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each kill: the newest checkpoint before it, the step the restart resumed from (its log
    line), damaged checkpoints skipped, and the steps redone."""
    import re

    out = []
    kills = [e for e in events if e["kind"] == "kill"]
    for e in kills:
        log = (run_dir / e["node"] / "node.log").read_text(errors="replace")
        newest = max((int(m.group(1)) for c in e["checkpoints"] if (m := re.search(r"(\d+)", c))), default=0)
        # The log holds one "peer id" line per process, and its resume line shortly after (stdout
        # and stderr): the n-th kill's restart resumes after the (n+1)-th of them.
        nth = sum(1 for k in kills if k["node"] == e["node"] and k["time"] <= e["time"])
        starts = log.split("swarm-node: peer id ")
        resumed = None
        if not e["checkpoints"]:  # killed before its first checkpoint (under load: before its DHT started,
            resumed = 0           # so its log has no "peer id" line): there is nothing to resume from
        elif len(starts) > nth + 1:
            found = re.findall(r"resumed from checkpoint at step (\d+)", starts[nth + 1])
            resumed = int(found[0]) if found else 0
        out.append({"node": e["node"], "minute": e["minute"], "last_step": e["last_step"],
                    "newest_checkpoint": newest, "resumed_from": resumed,
                    "intact": resumed == newest, "steps_redone": e["last_step"] - resumed if resumed is not None else None,
                    "damaged_skipped": "damaged checkpoint" in log})
    return out


def status_reads(run_dir: Path, light: set[str], ids: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for r in read_jsonl(run_dir / "status.jsonl"):
        shown = set(r["peer_ids"])
        out.append({"label": r["label"], "seconds": round(r["seconds"], 2), "records": r["records"],
                    "loadavg_1min": r.get("loadavg_1min"),
                    "exit_code": r["exit_code"], "light_shown": len(shown & light), "light_peers": len(light),
                    "training_shown": len(shown & set(ids)), "live": r["live_processes"]})
    return out


def heldout_trend(run_dir: Path, name: str) -> list[dict[str, Any]]:
    seen, out = set(), []
    for r in metrics_rows(run_dir / name):
        if "eval_accuracy" in r and r.get("eval_step") not in seen:
            seen.add(r.get("eval_step"))
            out.append({"step": int(r.get("eval_step", 0)), "accuracy": r["eval_accuracy"],
                        "lo": r.get("eval_lo"), "hi": r.get("eval_hi"), "n": r.get("eval_n")})
    return out


def scale_prediction(peers: int, active: int, steps_per_window: float, tokens: int,
                     status_interval_s: float | None = None) -> dict[str, Any]:
    """benchmarks.scale's model of this swarm (sharded index): `active` peers step `steps_per_window`
    times a window and publish in the first 16 of them (swarm.slots_per_window), the light peers once
    a window; groups of G=8 completions of `tokens` tokens; a status record stored at most every
    `status_interval_s` (the node's metrics.status_min_interval_s unless given; a step each when 0)
    and every status shard read every 100 s (record_ttl_s / 3), every record with 32 receipts. One
    measured window after two to settle."""
    import argparse

    from benchmarks.scale import Model, Sizes
    from swarm_node.config import MetricsConfig

    if status_interval_s is None:
        status_interval_s = MetricsConfig.model_fields["status_min_interval_s"].default
    rpw = max(1, round(steps_per_window))
    args = argparse.Namespace(groups=PROMPTS_PER_STEP, max_groups=MAX_PEER_GROUPS, max_per_peer=MAX_GROUPS_PER_PEER,
                              staleness=STALENESS, replicas=5, peers_per_shard=16, shards_per_read=1,
                              rounds_per_window=rpw, active=active, slots_per_window=16,
                              status_every=max(1, round(status_interval_s / WINDOW_S * rpw)),
                              status_read_every=max(1, round(100 / WINDOW_S * rpw)),
                              status_cap_records=256, status_cap_bytes=256 << 10)
    res = Model(peers, "sharded", args, Sizes.measure(tokens=max(1, tokens)), 0).run(rounds=rpw, warmup=2 * rpw)
    return {"peers": peers, "active": active, "rounds_per_window": rpw, "tokens": tokens,
            "status_interval_s": status_interval_s,
            "bytes_per_node_round": res["active_total_bytes_per_node_round"],
            "client_bytes_per_node_round": res["active_client_bytes_per_node_round"],
            "served_bytes_per_node_round": res["active_served_bytes_per_node_round"],
            "exchange_bytes_per_node_round": res["active_bytes_per_node_round"],
            "status_bytes_per_node_round": res["active_status_bytes_per_node_round"],
            "bytes_per_node_round_all_peers": res["total_bytes_per_node_round"],
            "payload_bytes_in_per_node_round": res["payload_bytes_in_per_node_round"]}


def node_prediction(predicted: dict[str, Any], steps_per_window: float | None) -> int:
    """The model's bytes per step for a node that steps `steps_per_window` times a window.

    The model's round is one step of the median node (`rounds_per_window` a window). Of a node's
    traffic, the client side of the exchange (its publishes and gathers) comes once a step, while
    what it serves as a replica and its status traffic (a record stored every
    metrics.status_min_interval_s, the shards read every record_ttl_s / 3) come per unit of time. A
    node stepping once in six windows carries six windows of the latter on each step: per step,
    client + (served + status) * rounds_per_window / steps_per_window. At the median rate this is the
    model's bytes_per_node_round."""
    rpw = predicted["rounds_per_window"]
    per_time = predicted["served_bytes_per_node_round"] + predicted["status_bytes_per_node_round"]
    if not steps_per_window or steps_per_window <= 0:
        return predicted["bytes_per_node_round"]
    return round(predicted["client_bytes_per_node_round"] + per_time * rpw / steps_per_window)


def summarise(run_dir: Path, plan: SoakPlan) -> dict[str, Any]:
    """The soak's JSON object: per node, recoveries, fairness, bytes against the scale model,
    status reads, receipts against ledgers, exclusions, checkpoints, the held-out trend, and the goals."""
    events = read_jsonl(run_dir / "events.jsonl")
    samples = read_jsonl(run_dir / "samples.jsonl")
    ledgers = read_jsonl(run_dir / "ledgers.jsonl")
    ids, light = peer_ids(run_dir, plan), light_ids(run_dir)
    switches = switch_spans(events)
    nodes = {n.name: {"role": n.role, **node_summary(run_dir, n.name, samples, outage_spans(events, n.name),
                                                     switches)}
             for n in plan.nodes}
    light_rows = [r for path in sorted((run_dir / "light").glob("light-*.jsonl")) for r in read_jsonl(path)]
    light_rss = [node_summary_rss(samples, f"light-{k}") for k in range(plan.light_processes)]
    steady = [v for v in nodes.values() if v.get("steps", 0) > 3 and v["role"] in ("train", "cut", "late")]
    spw = statistics.median(v["steps_per_minute"] * WINDOW_S / 60 for v in steady if v.get("steps_per_minute")) \
        if steady else 1.0
    tokens = [r.get("completion_tokens", 0) / r["samples"] for n in plan.nodes if n.role != "smollm2"
              for r in metrics_rows(run_dir / n.name) if r.get("samples")]
    predicted = scale_prediction(plan.peers, len(plan.nodes), spw, round(statistics.fmean(tokens)) if tokens else 16)
    for v in nodes.values():
        if v.get("daemon_bytes_per_step"):
            v["scale_model_bytes_per_step"] = node_prediction(predicted, v.get("daemon_steps_per_window"))
            v["daemon_bytes_vs_scale_model"] = round(v["daemon_bytes_per_step"] / v["scale_model_bytes_per_step"], 2)
    rec = recoveries(run_dir, events, ids, light_rows)
    fair = fairness(ledgers, ids, light)
    excl = exclusions(run_dir, plan, ids, light)
    kills = checkpoints_after_kills(run_dir, events)
    status = status_reads(run_dir, light, ids)
    given = given_agreement(run_dir, ids, events, ledgers)
    slow = next((n.name for n in plan.nodes if n.role == "slow"), None)
    smol = next((n.name for n in plan.nodes if n.role == "smollm2"), None)
    name_to_id = {v: k for k, v in ids.items()}
    slow_taken = fair["by_training_sender"].get(slow) if slow else None
    training = [v for v in nodes.values() if v["role"] != "slow"
                and v.get("took_peer_group_fraction_outside_outages") is not None]
    windows = 2 * WINDOW_S
    goals = {
        "honest_exclusions_0": not excl["excluded"] and excl["excluded_peer_drops"] == 0,
        "no_checkpoint_lost": all(k["intact"] and not k["damaged_skipped"] for k in kills),
        "took_peer_group_90pct": all(v["took_peer_group_fraction_outside_outages"] >= 0.9 for v in training),
        "recovery_within_two_windows": all(r["to_first_peer_group_s"] is not None and r["to_first_peer_group_s"]
                                           <= windows for r in rec),
        "status_within_2s_all_shown": bool(status) and all(s["seconds"] <= 2.0 and s["exit_code"] == 0
                                                           and s["light_shown"] == s["light_peers"] for s in status),
        "bytes_within_1_5x_of_model": all(0 < v.get("daemon_bytes_vs_scale_model", 0) <= 1.5
                                          for v in nodes.values() if v.get("daemon_bytes_per_step")),
        "rss_growth_at_most_5pct_hour": all(v["rss_growth_per_hour"] is None or v["rss_growth_per_hour"] <= 0.05
                                            for v in nodes.values() if v.get("rss_span_minutes", 0) >= 10),
        "no_sender_over_3x_mean": all(f.get("max_over_mean", 0) <= 3.0 for k, f in fair.items()
                                      if k in ("light", "training")),
        "receipts_agree_with_ledgers": given["pairs"] > 0 and given["agree"] == given["pairs"],
        "slow_node_groups_taken": bool(slow_taken) if slow else None,
    }
    return {
        "benchmark": "soak", "run_dir": str(run_dir), "minutes": plan.minutes,
        "peers": {"total": plan.peers, "training": len(plan.nodes), "light": plan.light_peers,
                  "light_seen": len(light)},
        "events": [{k: e[k] for k in ("minute", "kind") } | {"node": e.get("node", "")} for e in events
                   if e["kind"] in ("kill", "restart", "freeze", "thaw", "cut", "reconnect", "late_join", "seed",
                                    "end_prompt_set", "exited", "supervised_restart", "cut_skipped")],
        "nodes": nodes, "light": {"rss": light_rss, "publishes": len(light_rows),
                                  "gathered_mean": round(statistics.fmean(r["gathered"] for r in light_rows), 2)
                                  if light_rows else None},
        "recoveries": rec, "fairness": fair, "exclusions": excl, "kills": kills, "status": status,
        "given_vs_ledger": given, "scale_model": predicted, "steps_per_window_median": round(spw, 2),
        "loadavg_1min_mean": machine_load(samples),
        "slow_node": {"name": slow, "peer_id": name_to_id.get(slow), "groups_taken_by_others": slow_taken,
                      **({k: nodes[slow].get(k) for k in ("steps", "gen_seconds_mean", "step_seconds_mean")}
                         if slow else {})},
        "heldout": heldout_trend(run_dir, smol) if smol else [],
        "goals": goals,
    }


def machine_load(samples: list[dict[str, Any]]) -> float | None:
    """Mean 1-minute load average over the run (2 cores: above 2, processes wait for a core)."""
    loads = [s["loadavg_1min"] for s in samples if "loadavg_1min" in s]
    return round(statistics.fmean(loads), 1) if loads else None


def node_summary_rss(samples: list[dict[str, Any]], name: str) -> dict[str, Any]:
    mine = [s for s in samples if s["name"] == name]
    if not mine:
        return {"name": name}
    settled = [s for s in mine if s["time"] - mine[0]["time"] >= 300] or mine
    pts = [(s["time"], s["rss_kib"] / 1024) for s in settled]
    mean = statistics.fmean(v for _, v in pts)
    return {"name": name, "rss_mib_start": round(pts[0][1]), "rss_mib_end": round(pts[-1][1]),
            "rss_growth_per_hour": round(slope_per_hour(pts) / mean, 4) if mean else None}
