"""The grid workers' allocator (`swarm-node experiment --workers`, `--allocator`): one short run of
examples/sandbox_power_long.toml (F-TIS, specialists, seed 0; `--steps` steps, evaluations every
`--steps // 2`) made by two grid processes side by side, each with the environment `--workers` gives
its workers (`workers.worker_env`), one with the system's allocator and one with tcmalloc, `--repeats` times with the two swapped each time, so that both see
the same machine load. Both runs of a repeat must give the same held-out accuracies (the allocator
changes no arithmetic); `speedup` = median system seconds / median tcmalloc seconds.

    python -m benchmarks.allocator                 # 40 steps, 3 repeats: about 5 minutes on 2 cores
    python -m benchmarks.allocator --steps 20 --repeats 2
    python -m benchmarks.allocator --quick         # 2 steps, 1 repeat, 16 problems an evaluation

Warm models come from `--cache` (default: a temporary directory, trained on the first repeat;
not timed: each grid times its runs in done.json). Needs tcmalloc (Debian: libtcmalloc-minimal4).
Last line: one JSON object (benchmarks.common.emit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import emit, parse_args
from swarm_node.experiment.workers import find_allocator, worker_env

FILE = Path(__file__).resolve().parents[1] / "examples" / "sandbox_power_long.toml"
RUN = "runs/specialists/f-tis/seed0"


def _grid(out: Path, cache: Path, allocator: Path | None, steps: int, problems: int | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "swarm_node", "experiment", str(FILE), "--out", str(out),
           "--pair", "specialists", "--arm", "f-tis", "--seed", "0", "--set", f'experiment.cache_dir="{cache}"',
           "--set", f"experiment.steps={steps}", "--set", f"eval.every={max(1, steps // 2)}"]
    cmd += ["--set", f"eval.problems={problems}", "--set", f"eval.ood_problems={problems}"] if problems else []
    return subprocess.Popen(cmd, env=worker_env(os.environ, allocator), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _result(out: Path) -> tuple[float, list[float]]:
    seconds = json.loads((out / RUN / "done.json").read_text())["seconds"]
    accuracies = [json.loads(line)["accuracy"] for line in (out / RUN / "evals.jsonl").read_text().splitlines()]
    return seconds, accuracies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--eval-problems", type=int, default=None,
                    help="held-out and out-of-distribution problems per evaluation (default: the file's)")
    args = parse_args(ap, {"steps": 2, "repeats": 1, "eval_problems": 16})
    tcmalloc = find_allocator("auto")
    if tcmalloc is None:
        sys.exit("benchmarks.allocator: tcmalloc not found (Debian: apt-get install libtcmalloc-minimal4)")
    seconds: dict[str, list[float]] = {"system": [], "tcmalloc": []}
    identical = True
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache or Path(tmp) / "cache"
        prep = _grid(Path(tmp) / "prep", cache, None, 1, args.eval_problems)  # trains the warm models, untimed
        if prep.wait() != 0:
            sys.exit(f"benchmarks.allocator: the warm-up run failed: {prep.stderr.read()[-2000:]}")
        for r in range(args.repeats):
            order = ["system", "tcmalloc"] if r % 2 == 0 else ["tcmalloc", "system"]
            outs = {name: Path(tmp) / f"{name}-{r}" for name in order}
            procs = {name: _grid(outs[name], cache, None if name == "system" else tcmalloc, args.steps,
                                 args.eval_problems)
                     for name in order}
            for name, p in procs.items():
                if p.wait() != 0:
                    sys.exit(f"benchmarks.allocator: the {name} run failed: {p.stderr.read()[-2000:]}")
            (s_sys, acc_sys), (s_tc, acc_tc) = _result(outs["system"]), _result(outs["tcmalloc"])
            seconds["system"].append(s_sys)
            seconds["tcmalloc"].append(s_tc)
            identical &= acc_sys == acc_tc
            print(f"repeat {r + 1}: system {s_sys:.1f} s, tcmalloc {s_tc:.1f} s, accuracies identical: "
                  f"{acc_sys == acc_tc}", flush=True)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    emit({"benchmark": "allocator", "steps": args.steps, "repeats": args.repeats, "eval_problems": args.eval_problems,
          "tcmalloc": str(tcmalloc),
          "seconds_system": seconds["system"], "seconds_tcmalloc": seconds["tcmalloc"],
          "median_system_s": round(med["system"], 2), "median_tcmalloc_s": round(med["tcmalloc"], 2),
          "speedup": round(med["system"] / med["tcmalloc"], 3), "accuracies_identical": identical})


if __name__ == "__main__":
    main()
