"""Run a whole experiment grid (pairs x arms x seeds) into one directory, resumably.

    OUT/spec.json                      the resolved experiment spec
    OUT/heldout.json                   the evaluated problems (index, question, answer); validation.json
                                       instead when the spec evaluates the validation split; ood-heldout.json
                                       the out-of-distribution set (`eval.ood_task`)
    OUT/runs/<pair>/<arm>/seed<k>/     <node>/metrics.jsonl (the node's own log), evals.jsonl,
                                       budget.json (own budget and peer caps per node),
                                       done.json (written last: a run with it is finished;
                                       its seconds, mode and machine fingerprint)
    OUT/summary.md, summary.json, plots/<pair>.png

A run without `done.json` (interrupted) is removed and run again; finished runs are skipped, so
running the same command again after an interruption continues the grid where it stopped.
Several processes may run the same command on one directory at once (one thread each on a
multi-core machine): a process claims a run by an exclusive lock on `seed<k>.lock` beside its
directory, held while it runs (the kernel drops it if the process dies; a finished run's lock file
is removed), and passes over runs another process holds, so each run is made once and the
processes finish together.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarm_node.util.atomic import atomic_write_text, file_lock
from swarm_node.experiment.spec import ExperimentSpec, run_id
from swarm_node.experiment.configs import eval_task, node_config
from swarm_node.util.machine import fingerprint
from swarm_node.tasks.base import PromptSet

# While a grid runs, its summary (tables and plots of every finished run: about 2-3 s for a 100-run
# grid) is rewritten at most this often, and always at the end.
SUMMARY_EVERY_S = 300.0


def prepare_models(spec: ExperimentSpec, log: Callable[[str], None], names: set[str] | None = None,
                   seeds: list[int] | None = None) -> dict[tuple[str, int], str]:
    """(node name, seed) -> model name (a warm model's directory when the node has a warm-up: one per
    seed with `warmup_seed = "per_seed"`), for `names` and `seeds` (default: every node and seed).

    Warm models another process is training are passed over at first and waited for at the end, so
    that processes sharing a grid train different warm models side by side."""
    from swarm_node.experiment.warmup import ensure_warm_model

    wanted = [(node, seed) for node in spec.nodes if names is None or node.name in names
              for seed in (spec.experiment.seeds if seeds is None else seeds)]
    out: dict[tuple[str, int], str] = {}
    for wait in (False, True):
        for node, seed in wanted:
            if (node.name, seed) in out:
                continue
            warm = node.warmup_for(spec, seed)
            if warm is None:
                out[(node.name, seed)] = str(node.model)
                continue
            t0 = time.perf_counter()
            path = ensure_warm_model(warm, spec.experiment.cache_dir.expanduser() / "warm", log=log, wait=wait)
            if path is None:
                log(f"node {node.name} seed {seed}: warm model being trained by another process; later")
                continue
            log(f"node {node.name} seed {seed}: warm model {path.name} ({time.perf_counter() - t0:.0f}s)")
            out[(node.name, seed)] = str(path)
    return out


def warmup_questions(spec: ExperimentSpec) -> set[str]:
    """Every question any node's supervised warm-up may learn from, for any seed (the warm-up's
    questions do not depend on the experiment seed: `NodeSpec.warmup_spec`)."""
    from swarm_node.experiment.warmup import warmup_pool

    specs = {(w.levels, w.ops, w.op_weights, w.pool_seed, w.steps * w.batch_size): w for n in spec.nodes
             for s in spec.experiment.seeds if (w := n.warmup_for(spec, s)) is not None}  # one per pool
    return {p.question.strip() for w in specs.values() for p in warmup_pool(w)}


def heldout_set(spec: ExperimentSpec, train_sets: list[PromptSet]) -> PromptSet:
    """The first `eval.problems` problems of the eval task in the evaluated split (`eval.split`) that
    no node trains on or warms up on (by question text)."""
    from swarm_node.tasks.heldout import disjoint_heldout

    return disjoint_heldout(eval_task(spec), train_sets, spec.eval.problems, exclude=warmup_questions(spec),
                            split=spec.eval.split)


def ood_set(spec: ExperimentSpec, train_sets: list[PromptSet]) -> PromptSet | None:
    """The out-of-distribution set (`eval.ood_task`), with the same exclusions and split; None without one."""
    from swarm_node.config import TaskConfig
    from swarm_node.tasks.heldout import disjoint_heldout

    if spec.eval.ood_task is None:
        return None
    return disjoint_heldout(TaskConfig.model_validate(spec.eval.ood_task), train_sets, spec.eval.ood_problems,
                            exclude=warmup_questions(spec), split=spec.eval.split)


def budget_record(configs: list[tuple[str, Any]], steps: int) -> dict[str, Any]:
    """What each node of a run could spend and take: its own-generation budget (steps x prompts x G)
    and its peer caps, written beside the run (`budget.json`) so the summary can say whether a cap bound."""
    out = {}
    for name, cfg in configs:
        sw, tr, gen = cfg.swarm, cfg.train, cfg.generation
        out[name] = {"prompts_per_step": tr.prompts_per_step, "group_size": gen.group_size,
                     "own_samples_budget": steps * tr.prompts_per_step * gen.group_size,
                     "swarm": sw.enabled, "max_peer_fraction": sw.max_peer_fraction,
                     "max_peer_groups_per_step": sw.max_peer_groups_per_step,
                     "max_groups_per_peer": sw.max_groups_per_peer}
    return out


def _run_one(spec: ExperimentSpec, pair: Any, arm: Any, seed: int, run_dir: Path,
             models: dict[tuple[str, int], str], evaluator: Any, mode: str, log: Callable[[str], None]) -> float:
    """Make one run (pair x arm x seed) in a fresh `run_dir` (an interrupted one starts over); writes
    budget.json first and done.json last, and returns the run's seconds."""
    from swarm_node.experiment.lockstep import run_lockstep
    from swarm_node.experiment.swarm_mode import run_swarm

    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    configs = [(name, node_config(spec, spec.node(name), arm, seed, spec.nodes.index(spec.node(name)),
                                  run_dir / name, models[(name, seed)], pair_size=len(pair.nodes)))
               for name in pair.nodes]
    atomic_write_text(run_dir / "budget.json", json.dumps(budget_record(configs, spec.experiment.steps)))
    t0 = time.perf_counter()
    kwargs = dict(steps=spec.experiment.steps, evaluate=evaluator, eval_every=spec.eval.every, run_dir=run_dir, log=log)
    if mode == "lockstep":
        run_lockstep(configs, peer_lag=spec.peer_lag(arm), seed=seed, **kwargs)
    else:
        run_swarm(configs, **kwargs)
    seconds = time.perf_counter() - t0
    atomic_write_text(run_dir / "done.json", json.dumps({"seconds": seconds, "mode": mode, "machine": fingerprint()}))
    return seconds


def run_grid(spec: ExperimentSpec, out: Path, *, mode: str | None = None, pairs: list[str] | None = None,
             arms: list[str] | None = None, log: Callable[[str], None] = print,
             stop_after: int | None = None, seeds: list[int] | None = None,
             summary_every: float = SUMMARY_EVERY_S) -> dict[str, Any]:
    """Run every pair x arm x seed not yet finished under `out`, then write the summary and plots
    (also after a run when `summary_every` seconds have passed since the last, so an unfinished grid
    has a summary of what is done; 0: after every run).

    `pairs`, `arms`, `seeds`: only these pairs / arms / seeds (a swarm-mode confirmation runs the arms
    it confirms); several processes can share one output directory, with or without these filters;
    `stop_after`: run at most this many new runs, then return (tests use it to play an interruption)."""
    from swarm_node.experiment.evaluation import Evaluator
    from swarm_node.experiment.summary import write_summary
    from swarm_node.tasks import load_prompt_set

    mode = mode or spec.experiment.mode
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "spec.json", spec.model_dump_json(indent=1))
    for what, chosen, names in (("pairs", pairs, [p.name for p in spec.pairs]), ("arms", arms, [a.name for a in spec.arms]),
                                ("seeds", seeds, spec.experiment.seeds)):
        unknown = sorted(set(chosen or []) - set(names))
        if unknown:
            raise ValueError(f"unknown {what} {unknown}; the file has {names}")
    runs = [r for r in spec.runs() if (pairs is None or r[0].name in pairs) and (arms is None or r[1].name in arms)
            and (seeds is None or r[2] in seeds)]
    used = [n for n in spec.nodes if any(n.name in p.nodes for p, _, _ in runs)]
    models = prepare_models(spec, log, {n.name for n in used}, sorted({s for _, _, s in runs}))
    # every node's training set counts, so that the held-out set is the same whichever pairs run
    probe = [node_config(spec, n, spec.arms[0], 0, i, out / "probe", "unused") for i, n in enumerate(spec.nodes)]
    tasks = {json.dumps(c.task.model_dump(mode="json"), sort_keys=True): c.task for c in probe}
    train_sets = [load_prompt_set(t) for t in tasks.values()]
    heldout, ood = heldout_set(spec, train_sets), ood_set(spec, train_sets)
    split = spec.eval.split
    atomic_write_text(out / f"{split}.json", json.dumps([p.__dict__ for p in heldout.problems]))
    if ood is not None:
        atomic_write_text(out / f"ood-{split}.json", json.dumps([p.__dict__ for p in ood.problems]))
    evaluator = Evaluator(spec, heldout, probe[0].task.system_prompt,
                          out / ("eval0.json" if split == "heldout" else f"eval0-{split}.json"), ood=ood)
    lora = {n.name: c.model.lora.enabled for n, c in zip(spec.nodes, probe, strict=True)}

    def unfinished() -> int:  # in the whole selection, whichever process makes them
        return sum(1 for p, a, s in runs if not (out / "runs" / run_id(p, a, s) / "done.json").exists())

    done_now, t_grid, left_at_start = 0, time.perf_counter(), unfinished()
    t_summary = t_grid
    try:
        for i, (pair, arm, seed) in enumerate(runs):
            rid = run_id(pair, arm, seed)
            run_dir = out / "runs" / rid
            if (run_dir / "done.json").exists():
                log(f"[{i + 1}/{len(runs)}] {rid}: done already, skipped")
                continue
            if stop_after is not None and done_now >= stop_after:
                break
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            lock = run_dir.with_name(run_dir.name + ".lock")
            with file_lock(lock, wait=False) as claimed:
                if not claimed:
                    log(f"[{i + 1}/{len(runs)}] {rid}: running in another process, skipped")
                    continue
                if (run_dir / "done.json").exists():  # another process finished it since the check above
                    continue
                log(f"[{i + 1}/{len(runs)}] {rid} ({mode})")
                evaluator.model_keys = {name: f"{models[(name, seed)]}|lora={lora[name]}" for name in pair.nodes}
                seconds = _run_one(spec, pair, arm, seed, run_dir, models, evaluator, mode, log)
                lock.unlink()  # done.json is written: whoever locks a new file here sees it and passes over
            done_now += 1
            left = unfinished()  # the pace counts runs other processes on this directory finished too
            rate = (time.perf_counter() - t_grid) / max(1, left_at_start - left)
            log(f"[{i + 1}/{len(runs)}] {rid} finished in {seconds:.0f}s; {left} left, about {left * rate / 60:.0f} min")
            if time.perf_counter() - t_summary >= summary_every:
                write_summary(out, spec)
                t_summary = time.perf_counter()
    finally:
        evaluator.close()
    shutil.rmtree(out / "probe", ignore_errors=True)
    return write_summary(out, spec)
