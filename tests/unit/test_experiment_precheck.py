"""The experiment pre-check (`swarm_node.experiment.precheck`) on known models, with one tokenizer and
across tokenizers, and the cross-tokenizer experiment: its run metrics columns and example files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from swarm_node.experiment.spec import ExperimentSpec

ROOT = Path(__file__).resolve().parents[2]


# ---- pre-check ---------------------------------------------------------------------------------------------

PRECHECK = """
[experiment]
seeds = [0]
[defaults]
generation = { group_size = 4, max_new_tokens = 6 }
task = { name = "arithmetic", levels = [1], size = 200 }
[[nodes]]
name = "a"
model = "tiny-random:32x1"
weak_skill = "sub"
[[nodes]]
name = "b"
model = "tiny-random:32x1"
weak_skill = "add"
[[nodes]]
name = "hot"
model = "tiny-random:32x1"
temperature = 2.0
[[pairs]]
name = "same"
nodes = ["a", "b"]
[[pairs]]
name = "far"
nodes = ["a", "hot"]
[[arms]]
name = "f-tis"
variant = "f-tis"
"""


def test_precheck_numbers_on_known_models(monkeypatch, tmp_path):
    """Every sample counted correct (a fake reward): a copy of the node's own model gives KL 0 and
    weights 1; the same model sampling at temperature 2 (the most peers accept) is far (weights away from 1) and, having no weak
    skill itself, is reported but not required."""
    import swarm_node.tasks.registry as registry
    from swarm_node.experiment.precheck import run_precheck

    class AllCorrect:
        def score(self, text, problem):
            return type("S", (), {"correct": True})()

        def close(self):
            pass

    monkeypatch.setattr(registry, "make_reward_fn", lambda *a, **k: AllCorrect())
    path = tmp_path / "p.toml"
    path.write_text(PRECHECK)
    rows = run_precheck(ExperimentSpec.load(path), log=lambda m: None, prompts=4)
    by = {(r["pair"], r["node"], r["peer"]): r for r in rows}
    assert set(by) == {("same", "a", "b"), ("same", "b", "a"), ("far", "a", "hot")}
    same = by[("same", "a", "b")]
    assert same["peer_correct"] == same["peer_samples"] == 16 and same["skill"] == "sub" and same["required"]
    assert same["kl_p50"] == pytest.approx(0.0, abs=1e-5) and same["weight_p50"] == pytest.approx(1.0, abs=1e-4)
    assert same["survive"] and (same["estimator"], same["reduction"], same["g"], same["C"]) == ("k3_gen", "sum", 50.0, 2.0)
    far = by[("far", "a", "hot")]
    assert not far["required"] and far["kl_p50"] > 0.01 and abs(far["weight_p50"] - 1.0) > 0.01


XTOK = """
[experiment]
seeds = [0]
[defaults]
generation = { group_size = 2, max_new_tokens = 12 }
task = { name = "arithmetic", levels = [1], size = 200 }
[[nodes]]
name = "x"
model = "tiny-random:32x1:a"
weak_skill = "sub"
[[nodes]]
name = "y"
model = "tiny-random:32x1:TOK"
weak_skill = "add"
[[arms]]
name = "f-tis"
variant = "f-tis"
"""


def _fake_generation(monkeypatch):
    """Every peer completion is the text "\\\\boxed{345}" in the peer's own tokens plus its EOS, with the
    peer model's own logprobs, and every answer counts correct."""
    import numpy as np
    import torch

    import swarm_node.policy.generation as generation
    import swarm_node.tasks.registry as registry
    from swarm_node.policy.scoring import token_logprobs
    from swarm_node.policy.types import GeneratedCompletion

    class AllCorrect:
        def score(self, text, problem):
            return type("S", (), {"correct": True})()

        def close(self):
            pass

    class TextGenerator:
        def __init__(self, policy, cfg, seed):
            self.policy, self.cfg = policy, cfg

        @torch.no_grad()
        def generate(self, prompt_ids, n):
            tok = self.policy.tokenizer
            ids = [*tok.encode("\\boxed{345}", add_special_tokens=False), self.policy.stop_token_ids[0]]
            lps = token_logprobs(self.policy.model, prompt_ids, [ids] * len(prompt_ids), self.cfg.temperature, 8)
            return [[GeneratedCompletion(np.asarray(ids, dtype=np.int64), lp.numpy().astype(np.float32), "stop")] * n
                    for lp in lps]

    monkeypatch.setattr(registry, "make_reward_fn", lambda *a, **k: AllCorrect())
    monkeypatch.setattr(generation, "HFGenerator", TextGenerator)


def test_precheck_across_tokenizers(monkeypatch, tmp_path):
    """Across tokenizers the peer's samples are converted as a receiver converts them. One tokenizer
    posing as two (the peer's fingerprint made to differ; byte tokens, so one own token per chunk)
    gives the same-tokenizer numbers: all converted, KL 0, weight 1. A byte tokenizer next to the
    trained BPE: every sample converted and chunks of more than one own byte token."""
    import dataclasses

    import swarm_node.policy.models as models
    from swarm_node.experiment.precheck import run_precheck

    _fake_generation(monkeypatch)
    real_load, loads = models.load_policy, []

    def load_policy(cfg, seed=0):
        policy = real_load(cfg, seed=seed)
        loads.append(cfg.name)
        return dataclasses.replace(policy, fingerprint=f"{policy.fingerprint}-{len(loads) % 2}")

    monkeypatch.setattr(models, "load_policy", load_policy)
    path = tmp_path / "same.toml"
    path.write_text(XTOK.replace("TOK", "a"))
    rows = {r["node"]: r for r in run_precheck(ExperimentSpec.load(path), log=lambda m: None, prompts=3)}
    x = rows["x"]
    assert x["cross_tokenizer"] and x["converted"] == x["peer_correct"] == 6
    assert x["tokens_per_chunk"] == pytest.approx(1.0)
    assert x["kl_p50"] == pytest.approx(0.0, abs=1e-5) and x["weight_p50"] == pytest.approx(1.0, abs=1e-4)

    monkeypatch.setattr(models, "load_policy", real_load)
    path = tmp_path / "cross.toml"
    path.write_text(XTOK.replace("TOK", "c"))
    rows = {r["node"]: r for r in run_precheck(ExperimentSpec.load(path), log=lambda m: None, prompts=3)}
    for name, r in rows.items():
        assert r["cross_tokenizer"] and r["converted"] == r["peer_correct"] == 6, name
        assert math.isfinite(r["kl_p50"]) and 0.0 < r["weight_p50"] <= r["C"]
    # "\\boxed{345}" is fewer trained-BPE tokens than bytes: the byte node's chunks hold several tokens
    assert rows["x"]["tokens_per_chunk"] > 1.0
    assert rows["y"]["tokens_per_chunk"] >= 1.0


# ---- the cross-tokenizer experiment ------------------------------------------------------------------------



def test_run_metrics_cross_tokenizer_columns_on_known_input(tmp_path):
    """crosstok_samples adds up over steps, own tokens per chunk is weighted by each step's
    cross-tokenizer samples, the step time is the median."""
    from swarm_node.experiment.summary import run_metrics

    (tmp_path / "a").mkdir()
    rows = [{"step": 1, "step_seconds": 1.0, "crosstok_samples": 8, "crosstok_tokens_per_chunk": 2.0},
            {"step": 2, "step_seconds": 5.0, "crosstok_samples": 24, "crosstok_tokens_per_chunk": 1.0},
            {"step": 3, "step_seconds": 2.0, "crosstok_samples": 0}]
    (tmp_path / "a" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = run_metrics(tmp_path, "a")
    assert m["crosstok_samples"] == 32
    assert m["crosstok_tokens_per_chunk"] == pytest.approx((8 * 2.0 + 24 * 1.0) / 32)
    assert m["step_seconds_p50"] == 2.0
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metrics.jsonl").write_text(json.dumps({"step": 1, "step_seconds": 3.0}) + "\n")
    m = run_metrics(tmp_path, "b")
    assert m["crosstok_samples"] == 0 and math.isnan(m["crosstok_tokens_per_chunk"])


def test_crosstok_files_pair_two_tokenizers_with_metrics_fixed():
    """The cross-tokenizer experiment files load, pair nodes of different tokenizers, and name their
    primary metric before running."""
    spec = ExperimentSpec.load(ROOT / "examples" / "sandbox_crosstok.toml")
    bases = {n.name: n.warmup["base"] for n in spec.nodes}
    assert bases == {"add-spec": "tiny-random:64x2:a", "sub-spec": "tiny-random:64x2:c"}
    assert [a.name for a in spec.pair_arms(spec.pairs[0])] == ["isolated", "nois", "f-tis"]
    assert len(spec.experiment.seeds) >= 5 and spec.metrics.primary == "weak_skill" and spec.metrics.note
    assert spec.eval.split == "heldout" and spec.eval.problems == 1024
    smol = ExperimentSpec.load(ROOT / "examples" / "crosstok_smollm2.toml")
    assert {n.warmup["base"] for n in smol.nodes} == {"smollm2-135m", "tiny-random:64x2:c"}
    assert smol.metrics.primary == "overall" and len(smol.experiment.seeds) >= 3
