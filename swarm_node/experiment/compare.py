"""Paired Δ AUC between any two arms of a finished grid, for the same node (beyond the summary's
comparisons with isolated and with the "just more samples" reference), e.g. heterogeneous F-TIS
against homogeneous F-TIS, or F-TIS against F-VIS:

    python -m swarm_node.experiment.compare OUT specialists/f-tis homog-add/homogeneous add-spec [accuracy_sub]

reads OUT/summary.json (written by `swarm-node experiment`), pairs the two arms' runs of `node` by
seed and prints the mean and 95% Student-t interval of the per-seed differences of the AUC of one
accuracy key (default `accuracy`; `accuracy_<skill>` and `ood_accuracy` as in evals.jsonl).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from swarm_node.experiment.stats import mean_ci

USAGE = "python -m swarm_node.experiment.compare OUT specialists/f-tis homog-add/homogeneous add-spec [accuracy_sub]"


def paired_delta(runs: dict, first: str, second: str, node: str, key: str = "accuracy") -> tuple[float, float, int]:
    """(mean, half width, seeds) of AUC(first) - AUC(second) for `node`, paired by seed; arms are
    "pair/arm" names; `runs` is summary.json's "runs"."""
    sides = []
    for name in (first, second):
        pair, _, arm = name.partition("/")
        by_seed = runs.get(pair, {}).get(arm, {}).get(node)
        if not by_seed:
            raise ValueError(f"no finished runs of node {node!r} in {name!r}")
        sides.append(by_seed)
    a, b = sides
    seeds = sorted(s for s in a if s in b and key in a[s]["aucs"] and key in b[s]["aucs"])
    if not seeds:
        raise ValueError(f"{first} and {second} share no seed with {key!r} for node {node!r}")
    mean, half = mean_ci([a[s]["aucs"][key] - b[s]["aucs"][key] for s in seeds])
    return mean, half, len(seeds)


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(f"usage: {USAGE}", file=sys.stderr)
        return 2
    out, first, second, node, *key = argv
    path = Path(out) / "summary.json"
    try:
        runs = json.loads(path.read_text())["runs"]
        mean, half, n = paired_delta(runs, first, second, node, *key)
    except OSError as e:
        print(f"compare: cannot read {path}: {e.strerror}", file=sys.stderr)
        return 1
    except (ValueError, KeyError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"first": first, "second": second, "node": node, "key": (key or ["accuracy"])[0],
                      "delta_auc": mean, "half_width": half, "seeds": n}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
