"""Experiments' starting points: a base model (a tiny model built in code, or any model the node can
load, such as the embedded SmolLM2-135M), then a short supervised warm-up on the arithmetic task so
that RL starts from partial competence (GRPO learns only from groups whose rewards differ: a random
tiny model never answers right, and SmolLM2-135M answers "1 + 1 = 2" but never in the `\\boxed{}` the
reward requires).

A warm-up is a pure function of its `WarmupSpec` (the base tiny spec, which arithmetic levels and
which answer operations it sees, steps, learning rate, batch, seed), so its result is cached on disk
under a name derived from the spec and reused by every run of a grid; the directory is written
atomically (under a file lock) and is an ordinary model directory that `model.name` can name.

Its supervised problems (`warmup_pool`) are drawn from their own procedural set under `data_seed`
(default: `seed`); `seed` also orders the batches and seeds torch. An experiment with
`warmup_seed = "per_seed"` varies `seed` with the experiment seed and keeps `data_seed`, so each
seed starts from its own warm model while the questions learned, which the held-out set excludes,
stay the same for every seed.

Supervised targets are the bare boxed answer (`\\boxed{N}` then the end-of-turn token) after the
prompt the node renders itself, so the warm-up teaches the answer format and some arithmetic, and RL
improves the arithmetic. Loss is on completion tokens only.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from swarm_node.util.atomic import ensure_dir
from swarm_node.policy import tiny
from swarm_node.tasks.arithmetic import arithmetic_problem
from swarm_node.tasks.base import Problem
from swarm_node.tasks.prompts import render_prompt

WARMUP_VERSION = 1  # bump when the construction below changes: cached directories are then rebuilt
WARMUP_DATA_SEED = 7_777  # the supervised problems come from their own procedural set
OPS = ("add", "sub")


@dataclass(frozen=True)
class WarmupSpec:
    """What a warm-up is made of. `ops`: which problems it sees ("add", "sub" or both): a specialist
    warms up on one part of the distribution only. `op_weights` (instead of `ops`): the share of each
    operation among its level-1/2 problems, e.g. (("add", 0.9), ("sub", 0.1)): a complementary
    specialist that sees its weak skill a little (`warmup_problems` hits the shares exactly)."""

    base: str  # a tiny-random spec, or a model name `model.name` accepts (full fine-tuning)
    levels: tuple[int, ...] = (1,)
    ops: tuple[str, ...] = ("add", "sub")
    steps: int = 300
    learning_rate: float = 3e-3
    batch_size: int = 32
    seed: int = 0
    system_prompt: str | None = None
    extra: dict = field(default_factory=dict)  # reserved; part of the cache name
    data_seed: int | None = None  # the supervised problems' seed (None: `seed`)
    op_weights: tuple[tuple[str, float], ...] | None = None  # (op, weight) pairs; None: `ops` decides

    def __post_init__(self) -> None:
        if self.op_weights is not None:
            bad = [op for op, w in self.op_weights if op not in OPS or w < 0]
            if bad or not sum(w for _, w in self.op_weights) > 0:
                raise ValueError(f"warm-up op_weights must map {OPS} to weights >= 0 with a positive sum, "
                                 f"got {dict(self.op_weights)}")

    @property
    def pool_seed(self) -> int:
        return self.seed if self.data_seed is None else self.data_seed

    def cache_name(self) -> str:
        fields_ = asdict(self)
        del fields_["data_seed"]  # named only when it differs from `seed`: older names stay valid
        if fields_["op_weights"] is None:
            del fields_["op_weights"]  # likewise: only a weighted warm-up names its weights
        if self.pool_seed != self.seed:
            fields_["data_seed"] = self.pool_seed
        payload = json.dumps({**fields_, "version": WARMUP_VERSION}, sort_keys=True)
        return f"warm-{hashlib.sha256(payload.encode()).hexdigest()[:16]}"


def problem_op(problem: Problem) -> str:
    """'add' or 'sub' for levels 1-2 (read from the answer against the numbers in the question)."""
    nums = [int(t) for t in problem.question.replace("?", " ").replace(".", " ").split() if t.isdigit()]
    if len(nums) >= 2 and nums[0] + nums[1] == int(problem.answer):
        return "add"
    return "sub"


def op_quotas(spec: WarmupSpec, count: int) -> dict[str, int] | None:
    """How many of `count` level-1/2 problems each operation gets under `op_weights` (largest
    remainders, so the counts add up to `count`), or None without weights."""
    if spec.op_weights is None:
        return None
    total = sum(w for _, w in spec.op_weights)
    exact = {op: count * w / total for op, w in spec.op_weights}
    quotas = {op: int(x) for op, x in exact.items()}
    for op in sorted(exact, key=lambda o: quotas[o] - exact[o])[: count - sum(quotas.values())]:
        quotas[op] += 1
    return quotas


def warmup_problems(spec: WarmupSpec, count: int) -> list[Problem]:
    """`count` supervised problems of the spec's levels and operations (deterministic): with
    `op_weights`, exactly each operation's share (levels 1-2; other levels have no such split)."""
    out: list[Problem] = []
    quotas = op_quotas(spec, count)
    i = 0
    while len(out) < count:
        level = spec.levels[i % len(spec.levels)]
        p = arithmetic_problem(WARMUP_DATA_SEED + spec.pool_seed, level, i)
        i += 1
        op = problem_op(p) if level <= 2 else None
        if op is None:
            out.append(p)
        elif quotas is not None:
            if quotas.get(op, 0) > 0:
                quotas[op] -= 1
                out.append(p)
        elif op in spec.ops:
            out.append(p)
        if i > 50 * count + 1000:
            raise ValueError(f"warm-up ops {spec.ops} / op_weights {spec.op_weights} match no problems of levels {spec.levels}")
    return out


def warmup_pool(spec: WarmupSpec) -> list[Problem]:
    """Every supervised problem `train_warmup` may show (its batches are drawn from these): what a
    held-out set must not contain."""
    return warmup_problems(spec, spec.steps * spec.batch_size // 4 + 64)


def _examples(tok, problems: list[Problem], system_prompt: str | None) -> list[tuple[list[int], list[int]]]:
    out = []
    for p in problems:
        prompt = render_prompt(tok, p.question, system_prompt)
        target = tok("\\boxed{" + p.answer + "}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        out.append((prompt, list(target)))
    return out


def _batch_loss(model, batch: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    width = max(len(p) + len(t) for p, t in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (p, t) in enumerate(batch):
        seq = p + t
        ids[row, : len(seq)] = torch.tensor(seq)
        labels[row, len(p): len(seq)] = torch.tensor(t)
        mask[row, : len(seq)] = 1
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


def _base_model(name: str) -> tuple[torch.nn.Module, object]:
    """(model, tokenizer) to warm up: a tiny spec is built in code, anything else loaded as a node would."""
    if tiny.is_tiny_spec(name):
        base = tiny.parse_tiny_spec(name)
        tok = tiny.build_tiny_tokenizer(base.variant)
        return tiny.build_tiny_model(base, tok), tok
    from swarm_node.config import ModelConfig
    from swarm_node.policy.models import load_policy

    policy = load_policy(ModelConfig(name=name, device="cpu", dtype="float32"))
    return policy.model, policy.tokenizer


def train_warmup(spec: WarmupSpec, out: Path, log=print) -> dict:
    """Build or load the base model, train it on the spec's problems, save model + tokenizer to `out`."""
    model, tok = _base_model(spec.base)
    examples = _examples(tok, warmup_pool(spec), spec.system_prompt)
    rng = random.Random(spec.seed)
    log_every = min(100, max(1, spec.steps // 4))  # about four progress lines, at most one per 100 steps
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.0)
        losses = []
        for step in range(spec.steps):
            frac = step / max(1, spec.steps)
            for g in opt.param_groups:  # short linear warmup, then cosine-free linear decay
                g["lr"] = spec.learning_rate * min(1.0, (step + 1) / 20) * (1.0 - 0.9 * frac)
            loss = _batch_loss(model, rng.sample(examples, spec.batch_size), tok.pad_token_id)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            if (step + 1) % log_every == 0:
                log(f"warm-up {spec.cache_name()} step {step + 1}/{spec.steps} loss {sum(losses[-log_every:]) / log_every:.4f}")
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    info = {"spec": asdict(spec), "final_loss": sum(losses[-20:]) / min(20, len(losses)),
            "seconds": time.perf_counter() - start}
    (out / "warmup.json").write_text(json.dumps(info, indent=1))
    return info


def ensure_warm_model(spec: WarmupSpec, cache_dir: Path, log=print, wait: bool = True) -> Path | None:
    """The warm model's directory under `cache_dir`, trained once and reused (atomic, locked);
    `wait=False`: None at once while another process trains it."""
    return ensure_dir(Path(cache_dir) / spec.cache_name(), lambda out: train_warmup(spec, out, log), wait)
