"""Checkpoints: a resumed trainer takes exactly the step an uninterrupted one takes; kills are safe."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from swarm_node.config import CheckpointConfig, GenerationConfig, LoraConfig, ModelConfig, NodeConfig, TrainConfig
from swarm_node.policy.checkpoint import latest_checkpoint, list_checkpoints, load_latest_checkpoint, save_checkpoint
from swarm_node.policy.generation import HFGenerator
from swarm_node.policy.models import Policy, load_policy
from swarm_node.policy.trainer import Trainer
from swarm_node.policy.types import TrainSample

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield tmp_path_factory.mktemp("m")
    finally:
        torch.set_num_threads(threads)


def node_config(cache: Path, node_dir: Path, lora: bool = False, keep: int = 2) -> NodeConfig:
    return NodeConfig(
        node_dir=node_dir,
        model=ModelConfig(name="tiny-random:64x2", cache_dir=cache, device="cpu",
                          lora=LoraConfig(enabled=lora, rank=4, alpha=8.0)),
        train=TrainConfig(learning_rate=1e-3, schedule="cosine", warmup_steps=1, total_steps=6, micro_batch_size=4),
        checkpoint=CheckpointConfig(keep=keep),
    )


def build(cfg: NodeConfig) -> Trainer:
    return Trainer(load_policy(cfg.model, seed=cfg.train.seed), cfg.train, cfg.objective, temperature=1.0)


def batch(policy: Policy, seed: int) -> list[TrainSample]:
    tok = policy.tokenizer
    prompts = [tok(f"Problem {seed}-{i}: 3+{i}=?", add_special_tokens=False)["input_ids"] for i in range(2)]
    out = HFGenerator(policy, GenerationConfig(max_new_tokens=10), seed=seed).generate(prompts, n=3)
    rewards = [[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    return [TrainSample(f"{seed}-{g}", np.asarray(prompts[g]), c.token_ids, c.logprobs, rewards[g][k], False)
            for g, group in enumerate(out) for k, c in enumerate(group)]


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}


@pytest.mark.parametrize("lora", [False, True])
def test_resume_takes_the_same_next_step(cache: Path, tmp_path: Path, lora: bool) -> None:
    cfg = node_config(cache, tmp_path / "node", lora=lora)
    a = build(cfg)
    batches = [batch(a.policy, s) for s in range(3)]
    a.step(batches[0])
    a.step(batches[1])
    path = save_checkpoint(cfg.node_dir, a, cfg, {"peer_id": "me", "drops": {"stale": 2}})
    uninterrupted = a.step(batches[2])
    expected = weights(a)
    del a

    b = build(cfg)  # a fresh process would start exactly here
    assert any(not torch.equal(v, expected[n]) for n, v in weights(b).items())
    step, extra = load_latest_checkpoint(cfg.node_dir, b)
    assert (step, extra) == (2, {"peer_id": "me", "drops": {"stale": 2}}) and b.step_count == 2
    assert path.name == "step-00000002"
    resumed = b.step(batches[2])
    assert resumed["lr"] == uninterrupted["lr"] and resumed["loss"] == pytest.approx(uninterrupted["loss"], abs=1e-7)
    # Same Adam moments, same step count, same lr: the parameters after the step are the same.
    for n, v in weights(b).items():
        torch.testing.assert_close(v, expected[n], atol=1e-7, rtol=0)
    assert (path / "config.toml").read_text() == cfg.dump_toml()
    meta = json.loads((path / "meta.json").read_text())
    assert meta["is_lora"] == lora and meta["fingerprint"] == b.policy.fingerprint


class _ReportsAnotherDevice:
    """A policy whose `device` names another device than the one its parameters live on: the test
    double for a GPU node on this CPU-only machine. On CUDA the parameters are on `cuda` while a fresh
    AdamW keeps its `step` counters on the CPU; here the parameters are on the CPU and the policy
    reports `meta`, so a loader that maps the checkpoint onto `policy.device` puts the optimizer state
    on a device where neither the parameters nor a fresh optimizer keep it (meta tensors hold no data:
    such a resume cannot take the uninterrupted run's step)."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self.device = torch.device("meta")

    def __getattr__(self, name: str) -> object:
        return getattr(self._policy, name)


@pytest.mark.parametrize("lora", [False, True])
def test_resume_on_another_map_location_keeps_the_step_counter_where_a_fresh_optimizer_does(
        cache: Path, tmp_path: Path, lora: bool) -> None:
    cfg = node_config(cache, tmp_path / "node", lora=lora)
    a = build(cfg)
    batches = [batch(a.policy, s) for s in range(2)]
    a.step(batches[0])
    save_checkpoint(cfg.node_dir, a, cfg, {})
    a.step(batches[1])
    expected = weights(a)
    fresh_counter = next(iter(build(cfg).optimizer.state_dict()["state"].values()), None)
    assert fresh_counter is None  # a fresh AdamW creates its counters at its first step, on the CPU:
    counters_of_a = {s["step"].device for s in a.optimizer.state.values()}
    assert counters_of_a == {torch.device("cpu")}

    b = build(cfg)
    real_policy = b.policy
    b.policy = _ReportsAnotherDevice(real_policy)  # type: ignore[assignment]
    assert load_latest_checkpoint(cfg.node_dir, b) == (1, {})
    b.policy = real_policy
    counters = [s["step"] for s in b.optimizer.state.values()]
    assert counters and {c.device for c in counters} == counters_of_a and all(float(c) == 1.0 for c in counters)
    moments = {s["exp_avg"].device for s in b.optimizer.state.values()}
    assert moments == {p.device for p in b.params}
    b.step(batches[1])
    for n, v in weights(b).items():
        torch.testing.assert_close(v, expected[n], atol=1e-7, rtol=0)


def test_rng_states_are_restored(cache: Path, tmp_path: Path) -> None:
    cfg = node_config(cache, tmp_path / "node")
    trainer = build(cfg)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    save_checkpoint(cfg.node_dir, trainer, cfg, {})
    draws = (random.random(), float(np.random.rand()), float(torch.rand(1)), float(np.random.randn()))
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    load_latest_checkpoint(cfg.node_dir, build(cfg))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1)), float(np.random.randn())) == draws


def test_keep_newest_and_latest_pointer(cache: Path, tmp_path: Path) -> None:
    cfg = node_config(cache, tmp_path / "node", keep=2)
    trainer = build(cfg)
    assert load_latest_checkpoint(cfg.node_dir, trainer) is None
    for _ in range(4):
        trainer.step([])
        save_checkpoint(cfg.node_dir, trainer, cfg, {})
    assert [p.name for p in list_checkpoints(cfg.node_dir)] == ["step-00000003", "step-00000004"]
    assert (cfg.node_dir / "checkpoints" / "latest").read_text().strip() == "step-00000004"
    # A dangling pointer (its directory removed by hand) falls back to the newest complete checkpoint.
    (cfg.node_dir / "checkpoints" / "latest").write_text("step-00000009\n")
    assert latest_checkpoint(cfg.node_dir).name == "step-00000004"


def test_partial_write_is_ignored_and_cleaned(cache: Path, tmp_path: Path) -> None:
    cfg = node_config(cache, tmp_path / "node")
    trainer = build(cfg)
    trainer.step([])
    save_checkpoint(cfg.node_dir, trainer, cfg, {"n": 1})
    partial = cfg.node_dir / "checkpoints" / ".step-00000002.x1y2.tmp"  # a save killed half way
    partial.mkdir()
    (partial / "weights.safetensors").write_bytes(b"\x00" * 10)
    fresh = build(cfg)
    assert load_latest_checkpoint(cfg.node_dir, fresh) == (1, {"n": 1})
    assert not partial.exists()


def test_checkpoint_of_another_model_is_refused(cache: Path, tmp_path: Path) -> None:
    cfg = node_config(cache, tmp_path / "node")
    save_checkpoint(cfg.node_dir, build(cfg), cfg, {})
    other = node_config(cache, tmp_path / "node", lora=True)
    with pytest.raises(ValueError, match="is_lora"):
        load_latest_checkpoint(cfg.node_dir, build(other))


# The parts of a Trainer that checkpoints read, over a small linear layer. Kept as source so the
# killed child process can define it without importing transformers (it starts in seconds).
LINEAR_TRAINER = """
import torch
from types import SimpleNamespace

class LinearTrainer:
    def __init__(self):
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(256, 256)
        self.policy = SimpleNamespace(model_id="linear", revision=None, fingerprint="f" * 64, is_lora=False,
                                      device=torch.device("cpu"), trainable_parameters=self.layer.named_parameters)
        self.optimizer = torch.optim.AdamW(self.layer.parameters(), lr=1e-3)
        self.step_count = 0

    def step(self):
        self.layer(torch.randn(8, 256)).square().mean().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.step_count += 1

    def state_dict(self):
        return {"optimizer": self.optimizer.state_dict(), "step_count": self.step_count}

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_count = state["step_count"]
"""

CHILD = LINEAR_TRAINER + """
import sys
from pathlib import Path
from swarm_node.config import CheckpointConfig, NodeConfig
from swarm_node.policy.checkpoint import save_checkpoint
torch.set_num_threads(1)
cfg = NodeConfig(node_dir=Path(sys.argv[1]), checkpoint=CheckpointConfig(keep=3))
trainer = LinearTrainer()
while True:
    trainer.step()
    save_checkpoint(cfg.node_dir, trainer, cfg, {"step": trainer.step_count,
                                                 "w": trainer.layer.weight[0, :4].tolist()})
"""


def test_sigkill_during_checkpointing_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    latest = node_dir / "checkpoints" / "latest"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(node_dir)], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not latest.is_file() or latest.read_text().strip() < "step-00000003":
            assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
            assert time.monotonic() < deadline, "the child wrote no checkpoints in time"
            time.sleep(0.002)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    namespace: dict = {}
    exec(LINEAR_TRAINER, namespace)  # noqa: S102 - the same class the child used
    trainer = namespace["LinearTrainer"]()
    step, extra = load_latest_checkpoint(node_dir, trainer)
    assert step >= 3 and extra["step"] == step == trainer.step_count
    assert trainer.layer.weight[0, :4].tolist() == extra["w"]  # the weights of that very step
    assert not list((node_dir / "checkpoints").glob(".*.tmp"))
