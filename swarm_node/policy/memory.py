"""The memory a node needs, part by part, known before anything is loaded (arithmetic, no torch).

A plan is built from the model's shape (`ModelShape`: what config.json says) and the node's
settings; each part is bytes, and belongs to a phase:

    static    the whole run: the process baseline (CPU: python, torch, transformers, the
              tokenizer; CUDA: the context, outside torch's allocator), the weights, AdamW's two
              float32 moments, a vLLM engine's share
    train     a micro-batch's forward and backward: the gradients (they accumulate over the
              micro-batches), autocast's compute-dtype copy of the weights (held by the graph
              until the backward pass ends), the activations kept for the backward pass, the logits
    update    clipping and the AdamW step: the gradients and the step's temporaries
    generate  the HF generator's key/value cache for a generation batch and autocast's copy of
              the weights (the gradients are gone by then: the trainer frees them after each
              step); a spot-check's forward pass with the node's own model, which overlaps it
    load      CPU only: the weights file's pages while it is read (the high-water mark of RSS
              counts them)

On a CPU each phase's short-lived tensors also leave "heap slack" (freed blocks glibc keeps), a
part of RSS that the allocator does not count.

The peak is the static parts plus the largest phase: `MemoryPlan.total`; `MemoryPlan.allocated`
leaves out the baseline (what `torch.cuda.max_memory_allocated` counts). The trainer's dtypes
(`swarm_node.policy.precision`): weights the optimizer updates, their gradients and AdamW's
moments are float32; a LoRA node's frozen base is stored in the compute dtype; the forward and
backward passes run under autocast to the compute dtype. Under autocast the residual stream stays
in the weights' dtype (RMSNorm and RoPE compute in it), only matmul outputs are in the compute
dtype, so bf16 compute cuts activations by about a third, not a half.

Activations (`_activation_bytes`): per token and decoder layer, the tensors autograd keeps were
counted with `torch.autograd.graph.saved_tensors_hooks` on Llama layers of several shapes (fits
within 3% in bf16 and 10% in float32): about 6.4 h elements in the weights' dtype, 3.4 h + 4.2 i
(the MLP's gate, up, SiLU and product) + 0.7 kv_dim in the compute dtype, and one float32
log-sum-exp per head (h: hidden size, i: intermediate size, kv_dim: key/value width). The scorer
runs a group's prompt once and the completions on its key/value cache (`policy.scoring`), which
it repeats for each row and extends per layer (two more [b, P + T, kv_dim] tensors for keys and
values). With a mask (the completions' pass on the cache always has one), transformers' SDPA attention
expands the keys and values of grouped heads to every query head (`repeat_kv`: CUDA and CPU kernels
take `enable_gqa` only without a mask) and autograd keeps the expanded copies: [b, heads, P + T,
head_dim] per layer, 6 to 7 times the cache for Qwen2.5's grouping (`_expanded_kv_bytes`). Under
gradient checkpointing (`train.gradient_checkpointing`) each row is one whole
sequence (checkpointed layers keep no cache), each layer keeps only its input (h elements per
token in the weights' dtype), and the backward pass recomputes one layer at a time. The logits
[b, T, V] stay in the compute dtype (`scoring.sampled_logprobs` works on float32 chunks of
LOGPROB_CHUNK_ROWS rows); their gradient is a second such tensor.

Calibration (`python -m benchmarks.memory_plan`, real training steps of tiny Llamas of 12M-112M
parameters in float32, bf16 autocast, checkpointing and LoRA, and of the embedded SmolLM2-135M, on
CPU): the allocator's peak (live tensor bytes, the CPU's stand-in for CUDA's
max_memory_allocated) came out at 0.99-1.15 of `allocated` with the saved-tensor counts as they
are (ACTIVATION_FACTOR = TRANSIENT = 1), and peak RSS at 0.89-1.07 of `total` with the two CPU
constants below. On CUDA the same arithmetic has not been checked against a GPU here.

CUDA headroom: the device holds more than torch's live tensors. The caching allocator reserves more
than it has allocated for what churns (part "reserve": CUDA_ALLOCATOR_RESERVE, the CUDA
counterpart of the CPU's heap slack, not in `allocated`), the CUDA context and libraries sit
outside it (CUDA_CONTEXT_BYTES), and a vLLM engine with CUDA graphs keeps their memory pools beside
its `gpu_memory_utilization` share (VLLM_CUDA_GRAPH_BYTES, `node.memory_budget`). These three constants are stated assumptions with their sources below, not
measurements: no GPU has been lent to this project yet; `benchmarks.gpu_check --device cuda`
records the measured values (`allocator_reserve_measured`, `outside_torch_bytes_measured`) to
replace them. The node's fit keeps a further margin free (`node.memory_budget.FIT_MARGIN`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

GIB = 1 << 30
MIB = 1 << 20
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
Device = Literal["cpu", "cuda"]
LOGPROB_CHUNK_ROWS = 1024  # scoring.LOGPROB_CHUNK_ROWS: logit rows read in float32 at a time

# ---- constants (see the module docstring for where each comes from) ----------------------------
# Saved-tensor elements per token per decoder layer: in the weights' dtype (x h), in the compute
# dtype (x h, x intermediate, x kv_dim), float32 per attention head.
RESIDUAL_PER_H = 6.4
COMPUTE_PER_H = 3.4
COMPUTE_PER_I = 4.2
COMPUTE_PER_KV = 0.7
FLOAT32_PER_HEAD = 1.0
# The allocator's measured peak over the saved tensors counted above (1: the gradients of
# activations in the backward pass take the place of the activations they free).
ACTIVATION_FACTOR = 1.0
# A micro-batch's other transients (gradient of the logits, float32 chunks, a weight-sized gradient
# before it is added to `.grad`): counted exactly below; this factor scales them all.
TRANSIENT = 1.0
# The CPU process before the model: python, torch, transformers and the node's modules imported,
# the embedded tokenizer loaded: 452 MiB peak RSS measured.
CPU_BASELINE_BYTES = 450 * MIB
# CPU only: glibc's heap keeps freed blocks, so RSS exceeds the live bytes of the parts that churn
# during a step (activations, logits, generation's cache); measured (RSS - baseline) / live bytes
# of those parts: 1.05-1.45 (LoRA the highest), 1.2 for the embedded model. Part "heap slack".
CPU_HEAP_FACTOR = 1.25
# CUDA (assumptions until the first GPU run measures them, see the module docstring):
# - the context, kernel images and library handles outside torch's allocator (not in
#   max_memory_allocated): about 0.5 GiB with CUDA 12's lazy module loading on A100/H100-class GPUs
#   (the gap between nvidia-smi and torch.cuda.memory_reserved commonly reported by PyTorch users),
#   doubled for cuBLAS/cuBLASLt handles and a vLLM engine's own libraries in the same process;
CUDA_CONTEXT_BYTES = 1 * GIB
# - the caching allocator's reserved peak over its allocated peak for what churns: tensors freed and
#   allocated again at other sizes (activations, logits, caches: their sizes follow the sequence
#   lengths) leave split blocks and rounding (512 B, 2 MiB segments) behind; 1.1-1.3 in typical
#   training loops (PyTorch's CUDA memory management notes); the high end, applied to each phase's
#   parts. Parts allocated once or again at the same sizes (weights, AdamW's moments, autocast's
#   weight copy) reuse their blocks and get none;
CUDA_ALLOCATOR_RESERVE = 1.3
# - a vLLM engine's CUDA graph pools (vllm_enforce_eager off), which vLLM 0.x does not count in its
#   gpu_memory_utilization share: its start-up log reports 0.2-1 GiB for 0.5B-7B models at the
#   default capture sizes (vLLM issue reports); the high end.
VLLM_CUDA_GRAPH_BYTES = 1 * GIB


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer (Llama, Qwen2, Mistral: config.json's fields)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape | None:
        """From a transformers config.json dict; None when a size is missing (not a decoder we know)."""
        c = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
        try:
            hidden, layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
            heads = int(c.get("num_attention_heads") or max(1, hidden // 64))
            kv_heads = int(c.get("num_key_value_heads") or heads)
            head_dim = int(c.get("head_dim") or hidden // heads)
            inter = int(c.get("intermediate_size") or 4 * hidden)
        except (KeyError, TypeError, ValueError):
            return None
        return cls(hidden, layers, heads, kv_heads, head_dim, inter, vocab,
                   bool(config.get("tie_word_embeddings", c.get("tie_word_embeddings", False))))

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """A decoder layer's projection weights: q, k, v, o and the gated MLP's three."""
        attn = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_dim
        return attn + 3 * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * (self.layer_matmul_params + 2 * self.hidden) + self.hidden

    def lora_params(self, rank: int, targets: Iterable[str]) -> int:
        """Adapter parameters: rank x (in + out) per targeted projection per layer."""
        q_out = self.heads * self.head_dim
        sizes = {"q_proj": (self.hidden, q_out), "k_proj": (self.hidden, self.kv_dim),
                 "v_proj": (self.hidden, self.kv_dim), "o_proj": (q_out, self.hidden),
                 "gate_proj": (self.hidden, self.intermediate), "up_proj": (self.hidden, self.intermediate),
                 "down_proj": (self.intermediate, self.hidden)}
        per_layer = sum(rank * sum(sizes[t]) for t in set(targets) if t in sizes)
        return self.layers * per_layer


@dataclass(frozen=True)
class Precision:
    """Bytes per element: trained weights (their gradients too), a frozen base, compute."""

    param: int = 4
    base: int = 4
    compute: int = 4


@dataclass(frozen=True)
class Lora:
    rank: int
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Part:
    name: str
    phase: str  # static | train | update | generate | load | baseline
    bytes: int
    note: str = ""
    not_live: bool = False  # CPU heap slack, CUDA allocator reserve: held from the system, not live tensors


@dataclass(frozen=True)
class MemoryPlan:
    """Named parts in bytes; the peak is the static parts plus the largest phase."""

    device: Device
    micro_batch: int
    gradient_checkpointing: bool
    parts: tuple[Part, ...] = field(default_factory=tuple)

    def phase_bytes(self, phase: str) -> int:
        return sum(p.bytes for p in self.parts if p.phase == phase)

    @property
    def peak_phase(self) -> str:
        phases = [p.phase for p in self.parts if p.phase not in ("static", "baseline")]
        return max(dict.fromkeys(phases), key=self.phase_bytes, default="static")

    @property
    def total(self) -> int:
        """The peak: baseline + static parts + the largest phase (RSS on a CPU)."""
        peak = self.peak_phase
        return sum(p.bytes for p in self.parts if p.phase in ("baseline", "static", peak))

    @property
    def allocated(self) -> int:
        """The peak phase's live tensor bytes, without the baseline, the CPU heap's slack and the CUDA
        allocator's reserve: what torch's allocator holds at most (`torch.cuda.max_memory_allocated`)."""
        peak = self.peak_phase
        return sum(p.bytes for p in self.parts if p.phase in ("static", peak) and not p.not_live)

    def by_name(self) -> dict[str, int]:
        return {p.name: p.bytes for p in self.parts}


# ---- one training step ------------------------------------------------------------------------


def _saved_per_token_layer(shape: ModelShape, p: Precision, resid: int) -> float:
    """Bytes autograd keeps per token per decoder layer (see the module docstring)."""
    h, i = shape.hidden, shape.intermediate
    compute = COMPUTE_PER_H * h + COMPUTE_PER_I * i + COMPUTE_PER_KV * shape.kv_dim
    return (resid * RESIDUAL_PER_H * h + p.compute * compute
            + 4 * FLOAT32_PER_HEAD * shape.heads)


def _activation_bytes(shape: ModelShape, p: Precision, resid: int, rows: int, prompt: int, completion: int,
                      checkpointing: bool) -> int:
    """Activations a micro-batch keeps for its backward pass (one prompt per micro-batch)."""
    per_token = _saved_per_token_layer(shape, p, resid)
    head = (2 * resid + p.compute) * shape.hidden  # the final norm's input and output, lm_head's input
    if checkpointing:  # whole sequences; layer inputs kept, one layer recomputed at a time
        tokens = rows * (prompt + completion)
        layers = shape.layers * tokens * shape.hidden * resid + tokens * per_token
        layers += _expanded_kv_bytes(shape, p, resid, rows, prompt + completion)  # the recomputed layer's
    else:  # the prompt once, the completions on its cache: repeated per row and extended per layer
        tokens = prompt + rows * completion
        cache = shape.layers * rows * (2 * prompt + completion) * shape.kv_dim * (resid + p.compute)
        expanded = shape.layers * _expanded_kv_bytes(shape, p, resid, rows, prompt + completion)
        layers = shape.layers * tokens * per_token + cache + expanded
    return int(ACTIVATION_FACTOR * layers + rows * completion * head)


def _expanded_kv_bytes(shape: ModelShape, p: Precision, resid: int, rows: int, length: int) -> int:
    """One layer's keys and values expanded to every query head by SDPA under a mask (module docstring):
    [rows, heads, length, head_dim], keys after RoPE in the weights' dtype, values in the compute dtype;
    none when every query head has its own key/value head."""
    if shape.heads == shape.kv_heads:
        return 0
    return rows * length * shape.heads * shape.head_dim * (resid + p.compute)


def _logit_bytes(shape: ModelShape, p: Precision, rows: int, completion: int) -> int:
    """The logits [b, T, V] in the compute dtype and, at the start of the backward pass, their gradient
    and the float32 chunks `sampled_logprobs` works in."""
    n = rows * completion
    return int(2 * n * shape.vocab * p.compute + TRANSIENT * 2 * min(n, LOGPROB_CHUNK_ROWS) * shape.vocab * 4)


def step_plan(shape: ModelShape, *, device: Device, micro_batch: int, prompt_tokens: int, completion_tokens: int,
              precision: Precision = Precision(), lora: Lora | None = None, gradient_checkpointing: bool = False,
              baseline: bool = True) -> MemoryPlan:
    """The peak of one training step (any step after the first: AdamW's moments exist) of
    `micro_batch` rows of one prompt of `prompt_tokens`, each completion `completion_tokens` long.

    Parts: baseline (CPU process or CUDA context; `baseline=False` leaves it out), weights,
    compute copy (autocast's cast of float32 weights), optimizer, gradients, activations, logits,
    optimizer step (its temporaries), and on CPU the weights file read at load."""
    if micro_batch < 1 or prompt_tokens < 1 or completion_tokens < 1:
        raise ValueError("micro_batch, prompt_tokens and completion_tokens must be >= 1")
    trained = shape.params if lora is None else shape.lora_params(lora.rank, lora.targets)
    stored = precision.param if lora is None else precision.base  # the bytes of the model's own weights
    weights = shape.params * stored + (0 if lora is None else trained * 4)
    cast = compute_copy_bytes(shape, precision, stored)
    grad_bytes = 4 if lora is not None else precision.param
    act = _activation_bytes(shape, precision, stored, micro_batch, prompt_tokens, completion_tokens,
                            gradient_checkpointing)
    logits = _logit_bytes(shape, precision, micro_batch, completion_tokens)
    # the largest weight's gradient before it is added to `.grad` (the embedding or lm_head)
    grad_temp = int(TRANSIENT * (shape.vocab * shape.hidden * grad_bytes if lora is None else 0))
    # AdamW's step: CUDA runs the multi-tensor (foreach) kernels, one float32 temporary per element;
    # the CPU loops over tensors, a temporary of the largest one at a time.
    update_temp = trained * 4 if device == "cuda" else shape.vocab * shape.hidden * 4 if lora is None else 0
    parts = [
        Part("baseline", "baseline", (CPU_BASELINE_BYTES if device == "cpu" else CUDA_CONTEXT_BYTES) if baseline else 0,
             "python, torch, transformers, tokenizer" if device == "cpu" else "CUDA context (outside torch)"),
        Part("weights", "static", weights, f"{shape.params / 1e6:.0f}M x {stored} B"
             + ("" if lora is None else f" + adapter {trained / 1e6:.1f}M x 4 B")),
        Part("compute copy", "train", cast, "autocast's cast of the weights, kept for the backward pass"),
        Part("optimizer", "static", trained * 8, "AdamW: two float32 moments per trained parameter"),
        Part("gradients", "train", trained * grad_bytes, "kept over the micro-batches"),
        Part("activations", "train", act, f"{micro_batch} x ({prompt_tokens} + {completion_tokens}) tokens"
             + (", gradient checkpointing" if gradient_checkpointing else "")),
        Part("logits", "train", logits + grad_temp,
             f"[{micro_batch}, {completion_tokens}, {shape.vocab}] and its gradient"),
        Part("gradients (update)", "update", trained * grad_bytes, "until the optimizer step"),
        Part("optimizer step", "update", update_temp, "AdamW's temporaries"),
    ]
    parts.append(slack(device, "train", act + logits))
    if device == "cpu":
        parts.append(Part("weights file", "load", shape.params * stored, "the file's pages while it is read"))
    kept = tuple(p for p in parts if p.bytes or p.phase == "baseline")
    return MemoryPlan(device, micro_batch, gradient_checkpointing, kept)


def compute_copy_bytes(shape: ModelShape, precision: Precision, stored: int) -> int:
    """Autocast's copy of the matmul weights in the compute dtype (none when they are stored in it). It
    lives while an autocast region runs and the autograd graph holds it: a training micro-batch's
    forward and backward pass, a generation call, a spot-check; not the optimizer step."""
    matmul = shape.layers * shape.layer_matmul_params + shape.vocab * shape.hidden
    return matmul * precision.compute if precision.compute < stored else 0


def generation_parts(shape: ModelShape, precision: Precision, *, device: Device, stored: int, rows: int,
                     prompt_tokens: int, new_tokens: int) -> list[Part]:
    """The HF generator's share (it generates with the trainer's module): the key/value cache of a
    generation batch (keys in the weights' dtype after RoPE, values in the compute dtype) and a
    float32 [rows, V] logits step or two."""
    cache = shape.layers * rows * (prompt_tokens + new_tokens) * shape.kv_dim * (stored + precision.compute)
    logits = 4 * rows * shape.vocab * 4
    parts = [Part("kv cache", "generate", cache + logits, f"{rows} rows x {prompt_tokens + new_tokens} tokens"),
             Part("compute copy (generate)", "generate", compute_copy_bytes(shape, precision, stored),
                  "autocast's cast of the weights while generate runs")]
    return parts + [slack(device, "generate", cache)]


def spot_check_parts(shape: ModelShape, precision: Precision, *, device: Device, stored: int, rows: int,
                     prompt_tokens: int, completion_tokens: int) -> list[Part]:
    """A spot-check of `rows` completion prefixes with the node's own model (no gradient, the compute
    dtype: `peers.spotcheck`), overlapping generation: the prompt's cache repeated per row and extended
    over the completions in every layer, one layer's keys and values expanded to every query head, the
    [rows, T, V] logits in the compute dtype and one float32 chunk of LOGPROB_CHUNK_ROWS rows."""
    length = prompt_tokens + completion_tokens
    cache = shape.layers * rows * length * shape.kv_dim * (stored + precision.compute)
    expanded = _expanded_kv_bytes(shape, precision, stored, rows, length)
    n = rows * completion_tokens
    logits = n * shape.vocab * precision.compute + min(n, LOGPROB_CHUNK_ROWS) * shape.vocab * 4
    cast = compute_copy_bytes(shape, precision, stored)  # autocast's cache is per thread: its own copy
    return [Part("spot-check", "generate", cache + expanded + logits + cast,
                 f"{rows} completions x {length} tokens, no gradient, during generation"),
            slack(device, "generate", cache + expanded + logits, "spot-check")]


def heap_slack(phase: str, churn: int) -> Part:
    """CPU: what glibc's heap keeps beyond the live bytes of a phase's short-lived tensors."""
    return Part("heap slack" if phase == "train" else f"heap slack ({phase})", phase,
                int((CPU_HEAP_FACTOR - 1) * churn), "CPU: freed blocks the heap keeps",
                not_live=True)


def allocator_reserve(phase: str, churn: int, what: str = "") -> Part:
    """CUDA: what torch's caching allocator reserves beyond the live bytes of tensors whose sizes follow
    the sequence lengths (CUDA_ALLOCATOR_RESERVE)."""
    return Part(f"reserve ({what or phase})", phase, int((CUDA_ALLOCATOR_RESERVE - 1) * churn),
                f"CUDA allocator's cache: {CUDA_ALLOCATOR_RESERVE:g} x the live bytes of what churns", not_live=True)


def slack(device: Device, phase: str, churn: int, what: str = "") -> Part:
    """What the device holds beyond the live bytes of a phase's short-lived tensors."""
    return heap_slack(phase, churn) if device == "cpu" else allocator_reserve(phase, churn, what)


def with_parts(plan: MemoryPlan, extra: Iterable[Part]) -> MemoryPlan:
    return replace(plan, parts=plan.parts + tuple(p for p in extra if p.bytes))


def gib(n: float) -> str:
    """Bytes as GiB for a line of text: 0.53 GiB; small values in MiB."""
    return f"{n / GIB:.2f} GiB" if n >= 0.1 * GIB else f"{math.ceil(n / MIB)} MiB"
