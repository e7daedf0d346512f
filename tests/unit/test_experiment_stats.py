"""Experiment statistics and spec: intervals and areas equal hand-computed values; specs are checked."""

from __future__ import annotations

import math

import pytest

from swarm_node.experiment.spec import ExperimentSpec
from swarm_node.experiment.configs import node_config
from swarm_node.experiment.stats import curve_auc, mean_ci, t975
from swarm_node.experiment.summary import summarise


def test_mean_ci_on_known_input():
    # values 0.2, 0.4, 0.6: mean 0.4, sd 0.2, n 3 -> half width t_{0.975,2} * 0.2 / sqrt(3) = 4.303 * 0.11547
    m, h = mean_ci([0.2, 0.4, 0.6])
    assert m == pytest.approx(0.4)
    assert h == pytest.approx(4.303 * 0.2 / math.sqrt(3), rel=1e-9)
    assert h == pytest.approx(0.49687, abs=1e-4)
    # two values: df 1, t = 12.706
    m2, h2 = mean_ci([1.0, 3.0])
    assert (m2, h2) == (pytest.approx(2.0), pytest.approx(12.706 * math.sqrt(2) / math.sqrt(2)))


def test_mean_ci_degenerate_inputs():
    m, h = mean_ci([0.5])
    assert m == 0.5 and math.isnan(h)
    m, h = mean_ci([])
    assert math.isnan(m) and math.isnan(h)
    assert mean_ci([0.3, 0.3, 0.3]) == (pytest.approx(0.3), pytest.approx(0.0))
    assert t975(40) == 1.96
    with pytest.raises(ValueError):
        t975(0)


def test_curve_auc_is_mean_accuracy_over_the_run():
    # trapezoids: (0..10) (0+0.5)/2*10 = 2.5; (10..20) (0.5+0.5)/2*10 = 5 -> 7.5 / 20
    assert curve_auc([0, 10, 20], [0.0, 0.5, 0.5]) == pytest.approx(0.375)
    assert curve_auc([0, 5, 20], [0.2, 0.2, 0.2]) == pytest.approx(0.2)
    assert curve_auc([7], [0.3]) == 0.3
    with pytest.raises(ValueError):
        curve_auc([0, 1], [0.1])


SPEC = """
[experiment]
seeds = [0, 1, 2]
steps = 10
[[nodes]]
name = "a"
model = "tiny-random:64x1"
[[nodes]]
name = "b"
model = "tiny-random:32x1"
lora = true
learning_rate = 0.01
[[arms]]
name = "isolated"
isolated = true
[[arms]]
name = "f-tis"
correction = "tis"
filter = "on"
"""


def _spec(tmp_path, text=SPEC):
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return ExperimentSpec.load(path)


def test_summary_pairs_differences_by_seed(tmp_path):
    spec = _spec(tmp_path)
    runs = {
        "isolated": {0: 0.2, 1: 0.5, 2: 0.3},
        "f-tis": {0: 0.3, 1: 0.6, 2: 0.5},  # differences 0.1, 0.1, 0.2
    }
    data = {"all": {arm: {"a": {s: {"final": v, "auc": v / 2, "peer_samples_used": 4.0,
                                    "peer_filtered_fraction": 0.5, "is_weight_mean": 1.0, "kl_peer_mean": 0.1,
                                    "train_reward_last5": 0.0}
                                for s, v in by_seed.items()}} for arm, by_seed in runs.items()}}
    table = summarise(data, spec)
    d_mean, d_half = table["all|f-tis|a"]["d_final"]
    assert d_mean == pytest.approx(0.4 / 3)
    sd = math.sqrt(((0.1 - 0.4 / 3) ** 2 * 2 + (0.2 - 0.4 / 3) ** 2) / 2)
    assert d_half == pytest.approx(4.303 * sd / math.sqrt(3))
    assert table["all|f-tis|a"]["final"][0] == pytest.approx(1.4 / 3)
    assert table["all|isolated|a"]["d_final"] == (pytest.approx(0.0), pytest.approx(0.0))


def test_node_config_is_the_production_config(tmp_path):
    spec = _spec(tmp_path)
    iso = node_config(spec, spec.node("a"), spec.arms[0], seed=1, node_index=0, node_dir=tmp_path / "a")
    swarm = node_config(spec, spec.node("b"), spec.arms[1], seed=1, node_index=1, node_dir=tmp_path / "b")
    assert (iso.objective.correction, iso.objective.filter, iso.objective.variant) == ("none", "off", None)
    assert not iso.swarm.enabled and iso.swarm.max_peer_fraction == 0
    assert (swarm.objective.correction, swarm.objective.filter, swarm.objective.variant) == ("tis", "on", None)
    assert swarm.swarm.enabled
    assert swarm.model.lora.enabled and swarm.train.learning_rate == 0.01
    assert iso.train.total_steps == swarm.train.total_steps == 10
    assert iso.train.seed != swarm.train.seed
    assert iso.swarm.swarm_id == swarm.swarm.swarm_id == "exp-s1"  # prompt order agrees across arms
    assert len(spec.runs()) == 6 and spec.quick().experiment.seeds == [0]


def test_spec_rejects_unknown_nodes_and_variants(tmp_path):
    with pytest.raises(ValueError, match="unknown nodes"):
        _spec(tmp_path, SPEC + '[[pairs]]\nname = "p"\nnodes = ["a", "zz"]\n')
    with pytest.raises(ValueError):
        _spec(tmp_path, SPEC.replace('correction = "tis"', 'correction = "magic"'))
    with pytest.raises(ValueError, match="needs correction"):
        _spec(tmp_path, SPEC.replace('filter = "on"\n', ''))


GRIDS = ["examples/sandbox_grid.toml", "examples/paper_gpu_replication/experiment.toml"]  # the paper's grid shape
EXAMPLES = [*GRIDS, "examples/embedded_scale.toml", "examples/embedded_power.toml", "examples/sandbox_power_long.toml"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_experiment_files_validate(name, tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = ExperimentSpec.load(root / name)
    for pair in spec.pairs:
        for arm in spec.arms:
            for i, node in enumerate(pair.nodes):
                cfg = node_config(spec, spec.node(node), arm, 0, i, tmp_path / node, model_name="/x")
                switches = ("none", "off") if arm.isolated else (arm.correction, arm.filter)
                assert (cfg.objective.correction, cfg.objective.filter, cfg.objective.variant) == (*switches, None)
                assert cfg.swarm.enabled is not arm.isolated
    if name in GRIDS:  # isolated, the six variants vertical, F-TIS horizontal
        assert {a.variant_name for a in spec.arms} == {"isolated", "nois", "vis", "tis", "f-nois", "f-vis", "f-tis"}
        assert {(a.variant_name, a.collaboration) for a in spec.arms
                if a.collaboration == "horizontal"} == {("f-tis", "horizontal")}
        assert len(spec.experiment.seeds) >= 3 and len(spec.pairs) == 3


def _write_run(out, arm: str, seed: int, evals: list[dict], metrics: dict[str, list[dict]],
               done: dict | None = None) -> None:
    import json

    run = out / "runs" / "all" / arm / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    for node, rows in metrics.items():
        (run / node).mkdir()
        (run / node / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "done.json").write_text(json.dumps(done or {}))


def test_summary_statistics_on_a_known_run(tmp_path):
    """Peer samples that carried gradient, peer-token importance weights and both KL estimators' peer
    distributions, from a hand-written metrics log."""
    from swarm_node.experiment.summary import collect, markdown

    spec = _spec(tmp_path)
    kl = {"kl_peer_k3_gen_p50": 0.1, "kl_peer_k3_gen_p90": 1.0, "kl_peer_k3_gen_max": 3.0,
          "kl_peer_k3_theta_p50": 0.2, "kl_peer_k3_theta_p90": 5.0, "kl_peer_k3_theta_max": 100.0}
    kl2 = {"kl_peer_k3_gen_p50": 0.3, "kl_peer_k3_gen_p90": 2.0, "kl_peer_k3_gen_max": 2.5,
           "kl_peer_k3_theta_p50": 0.4, "kl_peer_k3_theta_p90": 7.0, "kl_peer_k3_theta_max": 1e6}
    rows = [  # is_weight_mean (own tokens included) and peer_samples_used (A = 0 included) must not be read
        {"step": 1, "reward_mean": 0.25, "peer_samples": 8, "peer_samples_used": 2, "peer_samples_gradient": 2,
         "peer_tokens": 40, "is_weight_peer_mean": 0.5, "is_weight_mean": 0.9, **kl},
        {"step": 2, "reward_mean": 0.5, "peer_samples": 8, "peer_samples_used": 5, "peer_samples_gradient": 3,
         "peer_tokens": 60, "is_weight_peer_mean": 1.0, "is_weight_mean": 0.99, **kl2},
        {"step": 3, "reward_mean": 0.75, "peer_samples": 0, "peer_samples_used": 0, "peer_samples_gradient": 0,
         "peer_tokens": 0, "is_weight_peer_mean": 0.0, **dict.fromkeys(kl, 0.0)},
    ]
    out = tmp_path / "out"
    _write_run(out, "f-tis", 0, [{"node": "a", "step": 0, "accuracy": 0.25}, {"node": "a", "step": 3, "accuracy": 0.5}],
               {"a": rows})
    _write_run(out, "isolated", 0, [{"node": "a", "step": 0, "accuracy": 0.25},
                                    {"node": "a", "step": 3, "accuracy": 0.375}], {"a": [{"step": 1}]})
    table = summarise(collect(out, spec), spec)
    row = table["all|f-tis|a"]
    assert row["peer_samples_gradient"] == 5
    assert row["peer_filtered_fraction"] == pytest.approx(1 - 7 / 16)
    assert row["is_weight_peer_mean"] == pytest.approx((0.5 * 40 + 1.0 * 60) / 100)  # over peer tokens
    assert (row["kl_k3_gen_p50"], row["kl_k3_gen_p90"], row["kl_k3_gen_max"]) == pytest.approx((0.2, 1.5, 3.0))
    assert (row["kl_k3_theta_p50"], row["kl_k3_theta_p90"], row["kl_k3_theta_max"]) == pytest.approx((0.3, 6.0, 1e6))
    assert row["train_reward_last5"] == pytest.approx(0.5)
    assert row["d_final"][0] == pytest.approx(0.125) and row["auc"][0] == pytest.approx(0.375)
    assert math.isnan(table["all|isolated|a"]["is_weight_peer_mean"])
    md = markdown(table, spec, out)
    assert "| f-tis | a | 0.500 | 0.375 | 0.125 | 0.062 | 5 | 0.56 | 0.80 | 1 |" in md
    assert "| f-tis | a | 0.2 | 1.5 | 3 | 0.3 | 6 | 1e+06 |" in md
    assert "| isolated | a | 0.375 | 0.312 |  |  |  |  |  | 1 |" in md


def test_summary_says_which_machines_made_the_runs(tmp_path):
    """Runs of two machines (a grid resumed elsewhere) are listed with their counts; a run made before
    runs recorded their machine counts as not recorded."""
    import json

    from swarm_node.experiment.summary import run_machines, write_summary

    spec = _spec(tmp_path)
    out = tmp_path / "out"
    avx2 = {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "torch": "2.13.0+cpu", "transformers": "5.19.0"}
    avx512 = {**avx2, "cpu": "Intel Xeon", "cpu_capability": "AVX512"}
    evals = [{"node": "a", "step": 0, "accuracy": 0.25}, {"node": "a", "step": 3, "accuracy": 0.5}]
    for arm, seed, machine in (("isolated", 0, avx2), ("isolated", 1, avx2), ("f-tis", 0, avx512)):
        _write_run(out, arm, seed, evals, {"a": [{"step": 1}]}, {"seconds": 1.0, "mode": "lockstep", "machine": machine})
    assert run_machines(out, spec) == [{"machine": avx2, "runs": 2}, {"machine": avx512, "runs": 1}]
    write_summary(out, spec)
    md = (out / "summary.md").read_text()
    assert ("Runs made on 2 machines (AMD EPYC (AVX2), torch 2.13.0+cpu, transformers 5.19.0: 2 runs; "
            "Intel Xeon (AVX512), torch 2.13.0+cpu, transformers 5.19.0: 1 run).") in md
    assert json.loads((out / "summary.json").read_text())["machines"][1] == {"machine": avx512, "runs": 1}
    _write_run(out, "f-tis", 1, evals, {"a": [{"step": 1}]})  # done.json "{}": before machines were recorded
    assert {"machine": {}, "runs": 1} in run_machines(out, spec)
    one = tmp_path / "one"
    _write_run(one, "isolated", 0, evals, {"a": [{"step": 1}]}, {"machine": avx2})
    write_summary(one, spec)
    assert "Every run (1 run) made on one machine: AMD EPYC (AVX2), torch 2.13.0+cpu" in (one / "summary.md").read_text()


def test_swarm_arms_are_compared_with_the_more_samples_reference(tmp_path):
    """Δ AUC of a swarm arm to the isolated-2x reference, paired by seed, in summary.json's rows and summary.md."""
    from swarm_node.experiment.primary import fixed_metrics

    text = SPEC.replace('[[arms]]\nname = "f-tis"', '[[arms]]\nname = "isolated-2x"\nvariant = "isolated"\n'
                        'own_budget = 2\n[[arms]]\nname = "f-tis"') + '[metrics]\nprimary = "overall"\n'
    spec = _spec(tmp_path, text)
    aucs = {"isolated": [0.20, 0.50, 0.30], "isolated-2x": [0.30, 0.55, 0.40], "f-tis": [0.35, 0.60, 0.40]}

    def run(v):
        return {"final": v, "auc": v, "aucs": {"accuracy": v}}

    data = {"all": {arm: {"a": {s: run(v) for s, v in enumerate(vs)}} for arm, vs in aucs.items()}}
    table = summarise(data, spec)
    row = table["all|f-tis|a"]
    assert row["reference"] == "isolated-2x"
    mean, half = row["d_aucs_reference"]["accuracy"]  # differences 0.05, 0.05, 0.0
    assert mean == pytest.approx(0.1 / 3)
    sd = math.sqrt(((0.05 - 0.1 / 3) ** 2 * 2 + (0.1 / 3) ** 2) / 2)
    assert half == pytest.approx(4.303 * sd / math.sqrt(3))
    assert row["d_aucs"]["accuracy"][0] == pytest.approx(0.35 / 3)  # to isolated, as before
    assert "reference" not in table["all|isolated-2x|a"]  # the reference is not compared with itself
    fixed, lines = fixed_metrics(table, spec)
    (f_tis,) = [r for r in fixed["primary"]["rows"] if r["arm"] == "f-tis"]
    assert (f_tis["d_auc_reference"], f_tis["verdict_reference"]) == (pytest.approx(0.1 / 3), "no")
    assert f"| all | f-tis | a | +0.033 ± {half:.3f} | no | 3 |" in lines
    # without a declared reference there is no comparison
    plain = summarise({"all": {k: v for k, v in data["all"].items() if k != "isolated-2x"}}, _spec(tmp_path))
    assert "reference" not in plain["all|f-tis|a"]


def test_compare_pairs_two_arms_of_different_pairs_by_seed(tmp_path, capsys):
    import json

    from swarm_node.experiment.compare import main, paired_delta

    def runs(values):
        return {str(s): {"aucs": {"accuracy": v, "accuracy_sub": v / 2}} for s, v in enumerate(values)}

    data = {"het": {"f-tis": {"a": runs([0.5, 0.6, 0.7, 0.9])}},
            "hom": {"homogeneous": {"a": runs([0.4, 0.6, 0.5])}}}  # seed 3 has no partner
    mean, half, n = paired_delta(data, "het/f-tis", "hom/homogeneous", "a")  # differences 0.1, 0.0, 0.2
    assert (mean, n) == (pytest.approx(0.1), 3)
    assert half == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert paired_delta(data, "het/f-tis", "hom/homogeneous", "a", "accuracy_sub")[0] == pytest.approx(0.05)
    with pytest.raises(ValueError, match="no finished runs"):
        paired_delta(data, "het/f-tis", "hom/nope", "a")
    (tmp_path / "summary.json").write_text(json.dumps({"runs": data}))
    assert main([str(tmp_path), "het/f-tis", "hom/homogeneous", "a"]) == 0
    assert json.loads(capsys.readouterr().out)["delta_auc"] == pytest.approx(0.1)
    assert main([str(tmp_path / "missing"), "het/f-tis", "hom/homogeneous", "a"]) == 1
    assert "cannot read" in capsys.readouterr().err


CONTRAST_SPEC = """
[experiment]
seeds = [0, 1, 2]
steps = 10
[metrics]
primary = "overall"
contrasts = ["p/f-tis - q/f-tis"]
[[nodes]]
name = "a"
model = "tiny-random:64x1"
[[nodes]]
name = "b"
model = "tiny-random:32x1"
[[nodes]]
name = "c"
model = "tiny-random:32x1:c"
[[pairs]]
name = "p"
nodes = ["a", "b"]
arms = ["f-tis"]
[[pairs]]
name = "q"
nodes = ["a", "c"]
[[arms]]
name = "isolated"
isolated = true
[[arms]]
name = "f-tis"
correction = "tis"
filter = "on"
"""


def test_contrasts_starting_points_and_paired_n(tmp_path):
    """A contrast between two pairs is paired by seed for the node they share; a pair without an isolated
    arm is paired with the node's isolated runs of another pair, and n counts the paired seeds only."""
    from swarm_node.experiment.primary import metric_rows
    from swarm_node.experiment.primary import contrast_rows
    from swarm_node.experiment.summary import starting_lines

    spec = _spec(tmp_path, CONTRAST_SPEC)

    def run(auc, start=0.1):
        return {"final": auc, "auc": auc, "acc": [start, auc], "steps": [0, 10], "aucs": {"accuracy": auc},
                "curves": {"accuracy": [start, auc]}, "finals": {"accuracy": auc}}

    data = {"q": {"isolated": {"a": {s: run(0.2 + s / 10, start=0.1 + s / 100) for s in (0, 1)},
                               "c": {s: run(0.3) for s in (0, 1, 2)}},
                  "f-tis": {"a": {s: run(0.3 + s / 10) for s in (0, 1, 2)}}},
            "p": {"f-tis": {"a": {s: run(0.25 + s / 10 + s / 100) for s in (0, 1, 2)}}}}
    table = summarise(data, spec)
    rows = {(r["pair"], r["node"]): r for r in metric_rows(table, spec, "overall")}
    assert rows[("p", "a")]["d_auc"] == pytest.approx(0.055) and rows[("p", "a")]["n"] == 2  # seed 2: no isolated run
    (c,) = contrast_rows(data, spec)
    diffs = [-0.05, -0.04, -0.03]  # p - q for node a, per seed
    assert (c["contrast"], c["node"], c["key"], c["n"]) == ("p/f-tis - q/f-tis", "a", "accuracy", 3)
    assert (c["d_auc"], c["half"]) == (pytest.approx(-0.04), pytest.approx(mean_ci(diffs)[1]))
    assert c["verdict"] == "loss"
    start, lines = starting_lines(data, spec)
    assert start["a"]["overall"][0] == pytest.approx(0.105) and start["a"]["seeds"] == [0, 1]
    assert set(start) == {"a", "c"} and any(line.startswith("| a | tiny-random:64x1 |") for line in lines)
    with pytest.raises(ValueError, match="share no node"):
        _spec(tmp_path, CONTRAST_SPEC.replace('nodes = ["a", "c"]', 'nodes = ["c"]'))
    with pytest.raises(ValueError, match="PAIR/ARM - PAIR/ARM"):
        _spec(tmp_path, CONTRAST_SPEC.replace("p/f-tis - q/f-tis", "p/f-tis"))
