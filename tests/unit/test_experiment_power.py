"""The sandbox with power (examples/sandbox_power.toml): warm-up operation weights give the intended
mix, the evaluation reports per-skill and OOD accuracy, isolated-2x has twice the own prompts, and
the summary shows the fixed primary metric (paired Δ AUC on the weak skill) first."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from swarm_node.experiment.evaluation import Evaluator, skill_accuracies, skill_of
from swarm_node.experiment.spec import ExperimentSpec
from swarm_node.experiment.configs import node_config
from swarm_node.experiment.summary import collect, markdown, summarise, write_summary
from swarm_node.experiment.warmup import WarmupSpec, op_quotas, problem_op, warmup_problems
from swarm_node.tasks.base import Problem, PromptSet

ROOT = Path(__file__).resolve().parents[2]
POWER = ROOT / "examples" / "sandbox_power.toml"


# ---- warm-up operation weights ---------------------------------------------------------------------------


def test_op_weights_give_exactly_the_intended_mix():
    spec = WarmupSpec(base="tiny-random:32x1", op_weights=(("add", 0.9), ("sub", 0.1)))
    problems = warmup_problems(spec, 200)
    ops = [problem_op(p) for p in problems]
    assert (ops.count("add"), ops.count("sub")) == (180, 20)
    for p in problems:  # problem_op read the operation right: the answer is the sum or the difference
        a, b = [int(t) for t in p.question.replace("?", " ").replace(".", " ").split() if t.isdigit()]
        assert int(p.answer) == (a + b if problem_op(p) == "add" else abs(a - b))
    # largest remainders: 7 x (0.9, 0.1) = (6.3, 0.7) -> (6, 1); shares need not sum to 1
    assert op_quotas(WarmupSpec(base="x", op_weights=(("add", 9.0), ("sub", 1.0))), 7) == {"add": 6, "sub": 1}
    assert op_quotas(WarmupSpec(base="x"), 7) is None
    with pytest.raises(ValueError, match="op_weights"):
        WarmupSpec(base="x", op_weights=(("mul", 1.0),))


def test_op_weights_leave_older_cache_names_and_ops_alone():
    # names computed by main before op_weights existed: a warm-up without weights keeps its cached model
    assert WarmupSpec(base="tiny-random:64x2", ops=("add",), system_prompt="Answer in \\boxed{}.").cache_name() \
        == "warm-9f5372182eacb4cb"
    assert WarmupSpec(base="tiny-random:64x2", seed=3, data_seed=0).cache_name() == "warm-3ab25cce1e869b14"
    only_add = [problem_op(p) for p in warmup_problems(WarmupSpec(base="x", ops=("add",)), 40)]
    assert set(only_add) == {"add"}
    a = WarmupSpec(base="x", op_weights=(("add", 0.9), ("sub", 0.1)))
    b = WarmupSpec(base="x", op_weights=(("add", 0.1), ("sub", 0.9)))
    assert len({a.cache_name(), b.cache_name(), WarmupSpec(base="x").cache_name()}) == 3


def test_power_file_warms_complementary_specialists():
    spec = ExperimentSpec.load(POWER)
    for name, strong, weak in (("add-spec", "add", "sub"), ("sub-spec", "sub", "add")):
        node = spec.node(name)
        assert node.weak_skill == weak
        warm = node.warmup_for(spec, 3)
        assert dict(warm.op_weights) == {strong: 0.9, weak: 0.1} and warm.seed == 3 and warm.data_seed == 0
        ops = [problem_op(p) for p in warmup_problems(warm, 100)]
        assert (ops.count(strong), ops.count(weak)) == (90, 10)
    # the twin is the same warm model: the homogeneous reference
    assert spec.node("add-twin").warmup_for(spec, 5) == spec.node("add-spec").warmup_for(spec, 5)


# ---- per-skill and OOD evaluation -----------------------------------------------------------------------


def _p(i: int, q: str, a: int) -> Problem:
    return Problem(index=i, question=q, answer=str(a))


HELD = [_p(0, "What is 3 plus 4?", 7), _p(1, "What is 9 minus 2?", 7),
        _p(2, "Tom has 5 apples. Anna gives Tom 3 more. How many apples does Tom have now?", 8),
        _p(3, "A jar holds 8 coins. Sam takes out 6. How many coins are still in the jar?", 2),
        _p(4, "What is 6 minus 1?", 5)]
OOD = [_p(0, "What is 31 plus 45?", 76), _p(1, "What is 90 minus 12?", 78)]


def test_skill_of_and_per_skill_accuracy_on_known_input():
    assert [skill_of(p) for p in HELD] == ["add", "sub", "add", "sub", "sub"]
    assert skill_of(_p(9, "What is 3 times 4?", 12)) is None  # one number pair, neither sum nor difference
    acc = skill_accuracies(HELD, [True, False, True, True, False])
    assert acc == {"accuracy_add": 1.0, "n_add": 2, "accuracy_sub": pytest.approx(1 / 3), "n_sub": 3}
    assert skill_accuracies(OOD, [False, True], prefix="ood_") == {
        "ood_accuracy_add": 0.0, "ood_n_add": 1, "ood_accuracy_sub": 1.0, "ood_n_sub": 1}


def test_evaluator_row_holds_overall_per_skill_and_ood(monkeypatch, tmp_path):
    import swarm_node.evaluation.evaluate as ev

    right = {HELD[0].question, HELD[1].question, HELD[2].question, OOD[1].question}

    def fake_evaluate(model, tok, prompt_set, reward_fn, **kw):
        recs = [{"index": p.index, "correct": p.question in right} for p in prompt_set.problems]
        return {"accuracy": sum(r["correct"] for r in recs) / len(recs), "n": len(recs), "records": recs, "seconds": 0.1}

    monkeypatch.setattr(ev, "evaluate", fake_evaluate)
    spec = ExperimentSpec.load(POWER)
    evaluator = Evaluator(spec, PromptSet("h", "number", tuple(HELD)), None, tmp_path / "eval0.json",
                          ood=PromptSet("o", "number", tuple(OOD)))
    policy = type("P", (), {"model": None, "tokenizer": None, "device": "cpu", "stop_token_ids": [0], "pad_token_id": 0})()
    try:
        row = evaluator("add-spec", policy, 0)
    finally:
        evaluator.close()
    assert row["accuracy"] == pytest.approx(3 / 5) and row["n"] == 5
    assert (row["accuracy_add"], row["accuracy_sub"]) == (pytest.approx(1.0), pytest.approx(1 / 3))
    assert (row["ood_accuracy"], row["ood_n"], row["ood_accuracy_add"], row["ood_accuracy_sub"]) == (0.5, 2, 0.0, 1.0)
    assert json.loads((tmp_path / "eval0.json").read_text())["add-spec"]["accuracy_sub"] == pytest.approx(1 / 3)


def test_power_heldout_and_ood_sets_are_large_and_disjoint():
    from swarm_node.experiment.grid import heldout_set, ood_set, warmup_questions
    from swarm_node.tasks import load_prompt_set

    spec = ExperimentSpec.load(POWER)
    train = [load_prompt_set(node_config(spec, spec.nodes[0], spec.arms[0], 0, 0, Path("/x"), "m").task)]
    held, ood = heldout_set(spec, train), ood_set(spec, train)
    assert len(held) == spec.eval.problems >= 1024 and len(ood) == spec.eval.ood_problems
    seen = {p.question for p in train[0].problems} | warmup_questions(spec)
    assert not {p.question for p in held.problems} & seen and not {p.question for p in ood.problems} & seen
    skills = [skill_of(p) for p in held.problems]
    assert min(skills.count("add"), skills.count("sub")) >= 400  # both skills measured on hundreds of problems
    assert {skill_of(p) for p in ood.problems} == {"add", "sub"}


# ---- arms: isolated-2x, arms per pair, caps ----------------------------------------------------------------


def test_isolated_2x_has_twice_the_own_prompts(tmp_path):
    from protocol.binding import select_prompts

    spec = ExperimentSpec.load(POWER)
    arms = {a.name: a for a in spec.arms}
    node = spec.node("add-spec")
    iso, double, ftis = (node_config(spec, node, arms[a], 1, 0, tmp_path / a, "m") for a in ("isolated", "isolated-2x", "f-tis"))
    assert double.train.prompts_per_step == 2 * iso.train.prompts_per_step == 2 * ftis.train.prompts_per_step == 8
    assert double.generation.group_size == iso.generation.group_size and not double.swarm.enabled
    # the first half of its prompts are the isolated arm's: the extra prompts come on top
    assert select_prompts("add-spec", 3, 8, 2000, "s")[:4] == select_prompts("add-spec", 3, 4, 2000, "s")
    with pytest.raises(ValueError, match="unknown seeds"):
        from swarm_node.experiment.grid import run_grid

        run_grid(spec, tmp_path / "out", seeds=[99], log=lambda m: None)
    with pytest.raises(ValueError, match="own_budget"):
        ExperimentSpec.model_validate({"nodes": [{"name": "a", "model": "m"}],
                                       "arms": [{"name": "x", "variant": "f-tis", "own_budget": 2}]})


def test_power_file_is_fixed_before_the_grid():
    from swarm_node.node.peer_rollouts import peer_group_cap

    spec = ExperimentSpec.load(POWER)
    assert len(spec.experiment.seeds) >= 8 and spec.eval.problems >= 1024 and spec.eval.ood_task["levels"] == [2]
    assert (spec.metrics.primary, spec.metrics.secondary) == ("weak_skill", ["overall", "ood"])
    runs = {(p.name, a.name) for p, a, s in spec.runs() if s == 0}
    assert {a for p, a in runs if p == "specialists"} == {"isolated", "isolated-2x", "nois", "vis", "tis", "f-vis",
                                                         "f-tis", "f-tis-horizontal"}
    assert {(p, a) for p, a in runs if p != "specialists"} == {("homog-add", "homogeneous"), ("homog-sub", "homogeneous"),
                                                              ("stranger", "nois"), ("stranger", "f-tis")}
    cfg = node_config(spec, spec.node("add-spec"), next(a for a in spec.arms if a.name == "f-tis"), 0, 0, Path("/x"), "m")
    sw, p = cfg.swarm, cfg.train.prompts_per_step
    assert peer_group_cap(p, sw.max_peer_fraction, sw.max_peer_groups_per_step) >= 2 * p  # a peer offers p a step
    assert sw.max_groups_per_peer * 0.25 >= 2 * p  # even at a fresh identity's weight (1 / (1 + 3))
    with pytest.raises(ValueError, match="unknown arms"):
        ExperimentSpec.model_validate({"nodes": [{"name": "a", "model": "m"}], "arms": [{"name": "i", "variant": "isolated"}],
                                       "pairs": [{"name": "p", "nodes": ["a"], "arms": ["zz"]}]})


# ---- summary: the primary metric first ---------------------------------------------------------------------

SPEC = """
[experiment]
seeds = [0, 1, 2]
steps = 4
[metrics]
primary = "weak_skill"
secondary = ["ood"]
note = "fixed in the test"
[[nodes]]
name = "a"
model = "tiny-random:32x1"
weak_skill = "sub"
[[nodes]]
name = "b"
model = "tiny-random:32x1"
weak_skill = "add"
[[pairs]]
name = "p"
nodes = ["a", "b"]
arms = ["isolated", "f-tis"]
[[pairs]]
name = "q"
nodes = ["a", "b"]
arms = ["nois"]
[[arms]]
name = "isolated"
variant = "isolated"
[[arms]]
name = "f-tis"
variant = "f-tis"
[[arms]]
name = "nois"
variant = "nois"
"""


def _write(out: Path, pair: str, arm: str, seed: int, sub_a: list[float], swarm: bool = True) -> None:
    run = out / "runs" / pair / arm / f"seed{seed}"
    run.mkdir(parents=True)
    rows = []
    for step, v in zip((0, 2, 4), sub_a, strict=True):
        rows.append({"node": "a", "step": step, "accuracy": 0.5, "accuracy_add": 0.8, "accuracy_sub": v,
                     "ood_accuracy": 0.1})
        rows.append({"node": "b", "step": step, "accuracy": 0.3, "accuracy_add": 0.1, "accuracy_sub": 0.5,
                     "ood_accuracy": 0.0})
    (run / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    budget = {n: {"prompts_per_step": 4, "group_size": 8, "own_samples_budget": 128, "swarm": swarm,
                  "max_peer_fraction": 0.5, "max_peer_groups_per_step": 4, "max_groups_per_peer": 4} for n in "ab"}
    (run / "budget.json").write_text(json.dumps(budget))
    for n in "ab":
        (run / n).mkdir()
        groups = [3, 4, 4, 2] if n == "a" else [4, 4, 4, 4]  # cap = min(4, floor(4 x 0.5 / 0.5)) = 4
        (run / n / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "peer_groups": g}) + "\n"
                                                       for i, g in enumerate(groups)))
    (run / "done.json").write_text("{}")


def test_summary_primary_metric_on_a_known_input(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(SPEC)
    spec = ExperimentSpec.load(path)
    out = tmp_path / "out"
    iso = {0: [0.2, 0.2, 0.2], 1: [0.3, 0.3, 0.3], 2: [0.1, 0.1, 0.1]}
    for s, v in iso.items():
        _write(out, "p", "isolated", s, v, swarm=False)
        d = (0.2, 0.3, 0.4)[s]  # f-tis: the weak skill rises by d over the run, so its AUC gains d / 2
        _write(out, "p", "f-tis", s, [v[0], v[0] + d / 2, v[0] + d])
        _write(out, "q", "nois", s, [v[0], v[0] - 0.1, v[0] + 0.2])  # AUC = v: gains 0, 0, 0
    table = write_summary(out, spec)
    row = table["p|f-tis|a"]
    # AUC of (0, v), (2, v + d/2), (4, v + d) = v + d/2: paired differences 0.1, 0.15, 0.2
    sd = math.sqrt(((0.1 - 0.15) ** 2 + 0 + (0.2 - 0.15) ** 2) / 2)
    assert row["d_aucs"]["accuracy_sub"] == (pytest.approx(0.15), pytest.approx(4.303 * sd / math.sqrt(3)))
    assert row["d_aucs"]["accuracy_add"] == (pytest.approx(0.0), pytest.approx(0.0))
    # pair q has no isolated arm: its arms are paired with the nodes' isolated runs of pair p
    assert table["q|nois|a"]["d_aucs"]["accuracy_sub"][0] == pytest.approx(0.0)
    # peers: offered 4 steps x 4 = 16, taken 3 + 4 + 4 + 2 = 13, two steps at the cap of 4
    assert (row["peer_groups_offered"], row["peer_groups_taken"], row["peer_cap_bound_steps"]) == (16, 13, 2)
    summary = json.loads((out / "summary.json").read_text())
    primary = summary["metrics"]["primary"]
    assert primary["metric"] == "weak_skill"
    by = {(r["pair"], r["arm"], r["node"]): r for r in primary["rows"]}
    assert by[("p", "f-tis", "a")]["key"] == "accuracy_sub" and by[("p", "f-tis", "a")]["verdict"] == "gain"
    assert by[("p", "f-tis", "b")]["key"] == "accuracy_add" and by[("p", "f-tis", "b")]["verdict"] == "no"
    assert summary["metrics"]["secondary"][0]["metric"] == "ood"
    md = (out / "summary.md").read_text()
    assert md.index("## Primary: Δ AUC on the node's weak skill") < md.index("## Secondary") < md.index("## p: a + b")
    assert f"| p | f-tis | 1x | a | accuracy_sub | 0.350 | +0.150 ± {4.303 * sd / math.sqrt(3):.3f} | gain | 3 |" in md
    assert "Intervals above 0: p/f-tis/a. Below 0: none." in md
    assert "| f-tis | a | 16.0 | 13.0 | 2.0 |" in md
    assert "fixed in the test" in md
    assert markdown(summarise(collect(out, spec), spec), spec, out) == md
