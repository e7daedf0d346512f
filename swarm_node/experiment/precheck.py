"""Pre-check of a specialist sandbox (`swarm-node experiment FILE --check`): before any grid runs, do a
peer's correct samples on a node's weak skill survive the node's filters?

For every pair that has a swarm arm, and every node of it with a `weak_skill`, each other node of
the pair (the peer) samples G completions (its own generation config and temperature, as in the
grid) for `prompts` problems of the node's weak skill from the node's training set; the correct ones
are scored by the node's warm model (at the node's own temperature, as the trainer does) and we
report, against the node's objective config (the swarm arm's):

    kl_p50        median per-sample KL (`objective.kl_estimator`, reduced by `kl_reduction`): to compare with g
    weight_p50    median token weight min(rho, C), rho = pi_theta / pi_gen, over every token of those samples
    survive       kl_p50 < g and weight_p50 > WEIGHT_FLOOR

A direction whose peer has no weak skill itself (a stranger) is reported but not required.

Across tokenizers (the peer's tokenizer fingerprint differs), the peer's correct samples go the way a
receiver takes them (`swarm_node.peers.crosstok_receive`): the text and piece bytes the sender would send
(`policy.pieces.completion_text`), re-tokenized by the node, aligned into chunks; KL and weights are
then per chunk, as in the objective (`swarm_node.method.chunks`), and the weight is each own
token's chunk weight. `converted` counts the correct samples that survive the conversion (a group
with one unconvertible completion would be dropped whole; here each sample is counted alone), and
`tokens_per_chunk` is the mean own tokens per chunk.

Everything runs on the warm models of one seed (the first), in seconds on a CPU.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarm_node.method.chunks import broadcast, chunk_mask, chunk_sum

WEIGHT_FLOOR = 0.1


def _swarm_arm(spec: Any, pair: Any) -> Any | None:
    arms = [a for a in spec.pair_arms(pair) if not a.isolated]
    return next((a for a in arms if a.variant_name == "f-tis"), arms[0] if arms else None)


def _weak_problems(cfg: Any, skill: str, count: int) -> list:
    from swarm_node.experiment.evaluation import skill_of
    from swarm_node.tasks import load_prompt_set

    problems = [p for p in load_prompt_set(cfg.task).problems if skill_of(p) == skill]
    return problems[:count]


@torch.no_grad()
def check_direction(node_cfg: Any, peer_cfg: Any, skill: str, prompts: int, seed: int) -> dict[str, Any]:
    """The numbers of one (node, peer) direction (module docstring)."""
    from swarm_node.method.kl import per_sample_kl
    from swarm_node.policy.generation import HFGenerator
    from swarm_node.policy.models import load_policy
    from swarm_node.policy.scoring import padded_batch, token_logprobs
    from swarm_node.tasks import make_reward_fn, render_prompt

    node = load_policy(node_cfg.model, seed=node_cfg.train.seed)
    peer = load_policy(peer_cfg.model, seed=peer_cfg.train.seed)
    problems = _weak_problems(node_cfg, skill, prompts)
    task = node_cfg.task
    prompt_ids = [render_prompt(peer.tokenizer, p.question, task.system_prompt, task.worked_example) for p in problems]
    groups = HFGenerator(peer, peer_cfg.generation, seed).generate(prompt_ids, peer_cfg.generation.group_size)
    reward_fn = make_reward_fn(task, "number", format_reward=0.0)
    try:
        correct = [(p, pid, c) for p, pid, group in zip(problems, prompt_ids, groups, strict=True) for c in group
                   if reward_fn.score(peer.tokenizer.decode(c.token_ids, skip_special_tokens=True), p).correct]
    finally:
        reward_fn.close()
    total = sum(len(g) for g in groups)
    out: dict[str, Any] = {"peer_samples": total, "peer_correct": len(correct),
                           "peer_accuracy": len(correct) / total if total else math.nan}
    kept = [(pid, c) for _, pid, c in correct if len(c.token_ids) > 0]
    cross = node.fingerprint != peer.fingerprint
    chunks = None
    if cross:  # the node's view of each sample: own prompt, own tokens, chunks, generator shares
        views = [(render_prompt(node.tokenizer, p.question, task.system_prompt, task.worked_example), v)
                 for p, v in ((p, _own_view(node, peer, c)) for p, _, c in correct if len(c.token_ids) > 0)
                 if v is not None]
        out.update(cross_tokenizer=True, converted=len(views))
        kept = [(pid, _AsCompletion(v.completion_ids, v.generator_logprobs)) for pid, v in views]
        chunks = [torch.as_tensor(v.chunk_ids, dtype=torch.int64) for _, v in views]
    if not kept:
        return {**out, "kl_p50": math.nan, "weight_p50": math.nan, "survive": False}
    theta = token_logprobs(node.model, [pid for pid, _ in kept], [c.token_ids for _, c in kept],
                           node_cfg.generation.temperature,
                           node_cfg.train.micro_batch_size or node_cfg.generation.group_size)  # 0: picked at start
    theta_lp, mask = padded_batch(theta)  # [B, T]
    gen_lp, _ = padded_batch([torch.as_tensor(c.logprobs, dtype=torch.float32) for _, c in kept])  # [B, T]
    obj = node_cfg.objective
    if chunks is not None:  # per chunk [B, C] (C = T), then each chunk's weight on its own tokens
        chunk_ids, _ = padded_batch(chunks)
        chunk_ids = chunk_ids.long()
        theta_c, gen_c = chunk_sum(theta_lp, chunk_ids, mask), chunk_sum(gen_lp, chunk_ids, mask)
        mask_c = chunk_mask(chunk_ids, mask)
        kl = per_sample_kl(theta_c, gen_c, mask_c, reduction=obj.kl_reduction, estimator=obj.kl_estimator)  # [B]
        ratio_c = torch.exp((theta_c - gen_c).clamp(-20, 20)).clamp(max=obj.truncation_c)
        weights = broadcast(ratio_c, chunk_ids, mask)[mask]
        out["tokens_per_chunk"] = float(mask.sum()) / float(mask_c.sum())
    else:
        kl = per_sample_kl(theta_lp, gen_lp, mask, reduction=obj.kl_reduction, estimator=obj.kl_estimator)  # [B]
        weights = torch.exp((theta_lp - gen_lp).clamp(-20, 20)).clamp(max=obj.truncation_c)[mask]  # valid tokens
    kl_p50, w_p50 = statistics.median(kl.tolist()), statistics.median(weights.tolist())
    return {**out, "kl_p50": kl_p50, "kl_p90": sorted(kl.tolist())[int(0.9 * (len(kl) - 1))],
            "kl_flagged": sum(v > obj.kl_threshold for v in kl.tolist()) / len(kl),
            "weight_p50": w_p50, "g": obj.kl_threshold, "estimator": obj.kl_estimator, "reduction": obj.kl_reduction,
            "C": obj.truncation_c, "survive": kl_p50 < obj.kl_threshold and w_p50 > WEIGHT_FLOOR}


@dataclass(frozen=True)
class _AsCompletion:
    """A converted sample in the shape the scoring above reads (own token ids, generator logprobs)."""

    token_ids: Any
    logprobs: Any


@dataclass(frozen=True)
class _Sent:
    """What a sender puts on the wire for one completion (text, piece bytes, logprobs, finish)."""

    text: str
    piece_bytes: Any
    logprobs: Any
    finish_reason: str


def _own_view(node: Any, peer: Any, completion: Any) -> Any | None:
    """The node's view (`crosstok_receive.OwnView`) of a peer completion of another tokenizer, or None
    when the sender would send no text or the receiver would drop it."""
    from swarm_node.peers.crosstok_receive import receive_completion
    from swarm_node.policy.pieces import completion_text

    sent = completion_text(peer.tokenizer, completion.token_ids)
    if sent is None:
        return None
    text, pieces = sent
    got = receive_completion(node.tokenizer, node.stop_token_ids[0],
                             _Sent(text, pieces, completion.logprobs, completion.finish_reason))
    return got.view


def run_precheck(spec: Any, log: Callable[[str], None] = print, prompts: int = 32) -> list[dict[str, Any]]:
    """Every (pair, node with a weak skill, peer) direction of the spec, on the first seed's warm models."""
    from swarm_node.experiment.grid import prepare_models
    from swarm_node.experiment.configs import node_config

    seed = spec.experiment.seeds[0]
    models = prepare_models(spec, log, seeds=[seed])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in spec.pairs:
            arm = _swarm_arm(spec, pair)
            if arm is None:
                continue
            cfgs = {n: node_config(spec, spec.node(n), arm, seed, spec.nodes.index(spec.node(n)), Path(tmp) / n,
                                   models[(n, seed)], pair_size=len(pair.nodes)) for n in pair.nodes}
            for name in pair.nodes:
                skill = spec.node(name).weak_skill
                for peer in (p for p in pair.nodes if p != name and skill is not None):
                    r = check_direction(cfgs[name], cfgs[peer], skill, prompts, seed)
                    # required: a peer that is itself a specialist (has a weak skill); a stranger is informational
                    required = spec.node(peer).weak_skill is not None
                    rows.append({"pair": pair.name, "arm": arm.name, "node": name, "peer": peer, "skill": skill,
                                 "required": required, **r})
                    log(f"{pair.name}: {peer} -> {name} on {skill}: peer correct {r['peer_correct']}/{r['peer_samples']}, "
                        f"median KL {r['kl_p50']:.3g} (g = {r.get('g', math.nan)}), median min(rho, C) "
                        f"{r['weight_p50']:.3g} (> {WEIGHT_FLOOR}): {'survive' if r['survive'] else 'DO NOT survive'}"
                        f"{'' if required else ' (informational: the peer is a stranger)'}"
                        + (f"; across tokenizers: {r['converted']}/{r['peer_correct']} correct samples converted, "
                           f"{r.get('tokens_per_chunk', math.nan):.3g} own tokens per chunk" if r.get("cross_tokenizer") else ""))
    return rows
