"""`python -m benchmarks.soak [--minutes M] [--light N] [--quick] [--run-dir DIR]`: see the package doc."""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path

from benchmarks.common import emit, parse_args
from benchmarks.soak.plan import full_plan, quick_plan
from benchmarks.soak.run import Soak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--light", type=int, default=36, help="light peers (in processes of 12)")
    parser.add_argument("--run-dir", type=Path, default=None)
    args = parse_args(parser, {"minutes": 5.0})  # --quick: 8 peers for 5 minutes (quick_plan)
    plan = quick_plan() if args.quick else full_plan(args.minutes, args.light)
    run_dir = args.run_dir or Path("runs") / time.strftime("soak-%Y%m%d-%H%M%S")
    soak = Soak(plan, run_dir)
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C or kill: stop the swarm cleanly, then report
        signal.signal(sig, soak.interrupt)
    try:
        soak.run()
    finally:
        soak.stop()
    from benchmarks.soak.plots import plot_run
    from benchmarks.soak.report import summarise

    summary = summarise(run_dir, plan)
    summary["plots"] = [str(p) for p in plot_run(run_dir, summary, run_dir / "plots")]
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    emit(summary)


if __name__ == "__main__":
    main()
