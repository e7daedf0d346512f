"""Leakage and selection in experiments: the held-out set excludes warm-up questions as well as
training ones, a validation split is disjoint from both and from the held-out set, and with
`warmup_seed = "per_seed"` every experiment seed starts from its own warm model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from swarm_node.experiment.grid import heldout_set, prepare_models, warmup_questions
from swarm_node.experiment.spec import ExperimentSpec
from swarm_node.experiment.configs import eval_task, node_config
from swarm_node.experiment.warmup import warmup_pool
from swarm_node.tasks import load_prompt_set
from swarm_node.tasks.heldout import VALIDATION_EVERY, split_of

ROOT = Path(__file__).resolve().parents[2]


def training_sets(spec: ExperimentSpec) -> list:
    probe = [node_config(spec, n, spec.arms[0], 0, i, Path("/nonexistent"), "unused") for i, n in enumerate(spec.nodes)]
    tasks = {json.dumps(c.task.model_dump(mode="json"), sort_keys=True): c.task for c in probe}
    return [load_prompt_set(t) for t in tasks.values()]


def questions(prompt_set) -> set[str]:
    return {p.question.strip() for p in prompt_set.problems}


@pytest.fixture(scope="module")
def sandbox():
    spec = ExperimentSpec.load(ROOT / "examples" / "sandbox_grid.toml")
    return spec, training_sets(spec), warmup_questions(spec)


def test_heldout_excludes_warmup_questions(sandbox):
    spec, train, warm = sandbox
    trained = set().union(*(questions(t) for t in train))
    held = heldout_set(spec, train)
    assert len(held) == spec.eval.problems == 64
    assert not questions(held) & trained and not questions(held) & warm
    # Before: the first 64 pool problems outside the training sets, 9 of them warm-up questions word for word.
    pool = load_prompt_set(eval_task(spec).model_copy(update={"size": 20 * 64}))
    before = [p.question.strip() for p in pool.problems if p.question.strip() not in trained][:64]
    assert sum(q in warm for q in before) == 9


def test_validation_split_is_disjoint_from_heldout_training_and_warmup(sandbox):
    spec, train, warm = sandbox
    held = heldout_set(spec, train)
    val_spec = spec.model_copy(deep=True)
    val_spec.eval.split = "validation"
    val_spec.eval.problems = 200  # any size: the splits are disjoint by construction
    val = heldout_set(val_spec, train)
    assert len(val) == 200 and val.id != held.id
    assert not questions(val) & questions(held)
    assert not questions(val) & warm and not questions(val) & set().union(*(questions(t) for t in train))
    assert {split_of(q) for q in questions(val)} == {"validation"} and {split_of(q) for q in questions(held)} == {"heldout"}
    # a larger held-out set (say the final grid's) still never meets the validation questions
    big = spec.model_copy(deep=True)
    big.eval.problems = 512
    assert not questions(heldout_set(big, train)) & questions(val)
    share = sum(split_of(f"question {i}") == "validation" for i in range(4000)) / 4000
    assert share == pytest.approx(1 / VALIDATION_EVERY, abs=0.03)


SPEC = """
[experiment]
seeds = [0, 1]
cache_dir = "{cache}"
warmup_seed = "{mode}"
[defaults]
task = {{ name = "arithmetic", levels = [1], size = 50 }}
[[nodes]]
name = "a"
warmup = {{ base = "tiny-random:32x1", steps = 3, batch_size = 4, learning_rate = 0.01 }}
[[nodes]]
name = "b"
model = "tiny-random:32x1"
[[arms]]
name = "isolated"
variant = "isolated"
"""


def _spec(tmp_path: Path, mode: str) -> ExperimentSpec:
    path = tmp_path / f"{mode}.toml"
    path.write_text(SPEC.format(cache=tmp_path / "cache", mode=mode))
    return ExperimentSpec.load(path)


def test_per_seed_warmup_gives_each_seed_its_own_warm_model(tmp_path):
    per_seed = _spec(tmp_path, "per_seed")
    assert per_seed.experiment.warmup_seed == "per_seed" == ExperimentSpec.model_validate(
        {"nodes": [{"name": "x", "model": "m"}], "arms": [{"name": "i", "variant": "isolated"}]}).experiment.warmup_seed
    models = prepare_models(per_seed, log=lambda m: None)
    assert models[("b", 0)] == models[("b", 1)] == "tiny-random:32x1"  # no warm-up: the model as named
    w0, w1 = (load_file(Path(models[("a", s)]) / "model.safetensors") for s in (0, 1))
    assert models[("a", 0)] != models[("a", 1)]
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)  # another starting point per seed
    # ... learned from the same questions, so the held-out set does not depend on the seeds
    specs = [per_seed.node("a").warmup_for(per_seed, s) for s in (0, 1)]
    assert [p.question for p in warmup_pool(specs[0])] == [p.question for p in warmup_pool(specs[1])]
    assert (specs[0].seed, specs[1].seed) == (0, 1)

    fixed = _spec(tmp_path, "fixed")
    same = prepare_models(fixed, log=lambda m: None)
    assert same[("a", 0)] == same[("a", 1)] == models[("a", 0)]  # seed 0 is the fixed warm model, reused
