"""The memory plan: its parts' values, how the node fits itself to a machine, and the refusal
before the model loads when nothing fits (fake memory sizes; the calibration against measured
peaks is benchmarks/memory_plan.py)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from swarm_node.node import memory_budget as mb
from swarm_node.node import preflight
from swarm_node.config import NodeConfig
from swarm_node.util.errors import InputError
from swarm_node.policy import memory
from swarm_node.policy.memory import GIB, Lora, ModelShape, Precision
from tests.cli_run import _restore_signals, run  # noqa: F401 (an autouse fixture)

SMOL = mb.EMBEDDED_SHAPE
FP32, BF16 = Precision(4, 4, 4), Precision(4, 4, 2)


def plan(m: int = 8, *, shape: ModelShape = SMOL, device: str = "cpu", precision: Precision = FP32,
         lora: Lora | None = None, ckpt: bool = False, prompt: int = 128, completion: int = 256) -> memory.MemoryPlan:
    return memory.step_plan(shape, device=device, micro_batch=m, prompt_tokens=prompt, completion_tokens=completion,
                            precision=precision, lora=lora, gradient_checkpointing=ckpt)


def test_shape_counts_the_parameters_a_built_model_has():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 32, "intermediate_size": 320, "vocab_size": 300, "tie_word_embeddings": False}
    model = LlamaForCausalLM(LlamaConfig(**config))
    shape = ModelShape.from_config(config)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert ModelShape.from_config({**config, "tie_word_embeddings": True}).params == shape.params - 300 * 128
    targets = ("q_proj", "v_proj", "down_proj")
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=list(targets), task_type="CAUSAL_LM"))
    assert shape.lora_params(4, targets) == sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert ModelShape.from_config({"hidden_size": 8}) is None
    assert SMOL.params == 134_515_008  # SmolLM2-135M


def test_parts_add_up_to_static_plus_the_largest_phase():
    p = plan()
    parts = p.by_name()
    assert parts["weights"] == SMOL.params * 4 and parts["optimizer"] == SMOL.params * 8
    assert parts["gradients"] == SMOL.params * 4 and "compute copy" not in parts  # float32 compute: no cast
    assert p.peak_phase == "train"
    assert p.total == parts["baseline"] + parts["weights"] + parts["optimizer"] + p.phase_bytes("train")
    slack = parts["heap slack"]  # CPU: RSS beyond the live bytes of the activations and logits
    churn = parts["activations"] + parts["logits"] - SMOL.vocab * SMOL.hidden * 4  # less the head's gradient
    assert slack == int((memory.CPU_HEAP_FACTOR - 1) * churn)
    assert p.allocated == p.total - memory.CPU_BASELINE_BYTES - slack
    gpu = plan(device="cuda")
    reserve = gpu.by_name()["reserve (train)"]  # CUDA's counterpart of the heap slack: not live bytes
    assert reserve == int((memory.CUDA_ALLOCATOR_RESERVE - 1) * churn)
    assert gpu.total - gpu.allocated == memory.CUDA_CONTEXT_BYTES + reserve and "heap slack" not in gpu.by_name()
    # CUDA's multi-tensor AdamW holds a float32 temporary per element during the update
    assert gpu.by_name()["optimizer step"] == SMOL.params * 4


def test_more_rows_or_tokens_need_more_memory():
    totals = [plan(m).total for m in (1, 2, 4, 8, 16)]
    assert totals == sorted(totals) and len(set(totals)) == 5
    act = [plan(8, completion=t).by_name()["activations"] for t in (64, 128, 256)]
    assert act[2] - act[1] == pytest.approx(2 * (act[1] - act[0]), rel=0.02)  # linear in completion tokens
    logits = [plan(m).by_name()["logits"] for m in (4, 8)]  # logits and their gradient: 2 x [b, T, V] float32
    assert logits[1] - logits[0] == 2 * 4 * 256 * SMOL.vocab * 4


def test_checkpointing_keeps_layer_inputs_only():
    full, ckpt = plan(8).by_name()["activations"], plan(8, ckpt=True).by_name()["activations"]
    assert ckpt < 0.2 * full
    # a completion token more: each row keeps a layer input (h floats) per layer, and one layer's activations
    grow_ckpt = plan(8, ckpt=True, completion=257).by_name()["activations"] - ckpt
    grow_full = plan(8, completion=257).by_name()["activations"] - full
    assert 8 * SMOL.layers * SMOL.hidden * 4 < grow_ckpt < 0.15 * grow_full


def test_lora_trains_few_parameters():
    lora = Lora(16, ("q_proj", "k_proj", "v_proj", "o_proj"))
    full, adapted = plan(precision=FP32).by_name(), plan(precision=Precision(4, 2, 2), lora=lora).by_name()
    trained = SMOL.lora_params(16, lora.targets)
    assert adapted["optimizer"] == trained * 8 and adapted["optimizer"] < 0.02 * full["optimizer"]
    assert adapted["gradients"] == trained * 4
    assert adapted["weights"] == SMOL.params * 2 + trained * 4  # bf16 frozen base, float32 adapter


def test_bf16_compute_lowers_activations_and_adds_a_weight_copy():
    fp32, bf16 = plan(precision=FP32).by_name(), plan(precision=BF16).by_name()
    assert 0.5 < bf16["activations"] / fp32["activations"] < 0.8  # the residual stream stays float32
    # the [8, 256, V] logits and their gradient halve; the float32 chunks and the head's gradient do not
    assert fp32["logits"] - bf16["logits"] == 2 * 8 * 256 * SMOL.vocab * 2
    matmul = SMOL.layers * SMOL.layer_matmul_params + SMOL.vocab * SMOL.hidden
    assert bf16["compute copy"] == matmul * 2 and bf16["weights"] == fp32["weights"]


def test_precision_follows_the_trainer_resolution():
    from swarm_node.policy import precision as torch_precision

    for compute, param, lora in [("auto", "auto", False), ("bfloat16", "auto", False), ("auto", "auto", True),
                                 ("bfloat16", "auto", True)]:
        cfg = NodeConfig.load(None, [f'model.compute_dtype="{compute}"', f'model.param_dtype="{param}"',
                                     f"model.lora.enabled={str(lora).lower()}"])
        c = torch_precision.resolve_compute_dtype(compute, torch.device("cpu"))
        p = torch_precision.resolve_param_dtype(param, c, frozen_base=lora)
        got = mb.precision_of(cfg.model, "cpu")
        assert (got.compute, got.base) == (c.itemsize, p.itemsize)
        assert got.param == (4 if lora else p.itemsize)
    gpu = mb.precision_of(NodeConfig().model, "cuda")
    assert (gpu.param, gpu.compute) == (4, 2)  # auto on a bf16 GPU: float32 master weights, bf16 compute


def _cfg(*sets: str) -> NodeConfig:
    return NodeConfig.load(None, ['model.name="smollm2-135m"', *sets])


def _budget(gib_available: float, device: str = "cpu") -> mb.Budget:
    return mb.Budget(device, int(gib_available * GIB), int(2 * gib_available * GIB), "RAM")


def test_generator_share_by_backend():
    cfg = _cfg("generation.backend=\"vllm\"", "generation.vllm_gpu_memory_utilization=0.4")
    on_gpu = mb.node_plan(cfg, SMOL, "cuda", gpu_total=80 * GIB).by_name()
    assert on_gpu["generator"] == int(0.4 * 80 * GIB)
    on_cpu = mb.node_plan(cfg, SMOL, "cpu").by_name()
    assert on_cpu["generator"] == SMOL.params * 4 + GIB  # its float32 weights and vllm_kv_cache_gib
    hf = mb.node_plan(_cfg('generation.backend="hf"'), SMOL, "cpu", prompt_tokens=100).by_name()
    # 4 prompts x G 8 = 32 rows of 100 + 256 tokens, keys and values of every layer in float32
    assert hf["kv cache"] >= 32 * 356 * SMOL.layers * SMOL.kv_dim * 8


def test_fit_picks_the_largest_micro_batch_that_fits():
    cfg = _cfg("train.micro_batch_size=0", 'generation.backend="hf"')
    totals = {m: mb.node_plan(cfg, SMOL, "cpu", micro_batch=m, checkpointing=False).total for m in range(1, 9)}
    assert mb.fit(cfg, SMOL, _budget(100)).micro_batch == 8  # the group size bounds it
    between = (totals[5] + totals[6]) / 2 / GIB
    chosen = mb.fit(cfg, SMOL, _budget(between))
    assert (chosen.micro_batch, chosen.gradient_checkpointing) == (5, False)
    assert mb.fit(_cfg("train.micro_batch_size=4", 'generation.backend="hf"'), SMOL, _budget(between)).micro_batch == 4


def test_fit_switches_checkpointing_on_only_when_nothing_fits_without_it():
    cfg = _cfg("train.micro_batch_size=0", 'generation.backend="hf"')
    plain_one = mb.node_plan(cfg, SMOL, "cpu", micro_batch=1, checkpointing=False).total
    ckpt_one = mb.node_plan(cfg, SMOL, "cpu", micro_batch=1, checkpointing=True).total
    assert ckpt_one < plain_one
    chosen = mb.fit(cfg, SMOL, _budget((ckpt_one + plain_one) / 2 / GIB))
    assert chosen.gradient_checkpointing and chosen.micro_batch >= 1
    assert chosen.plan.total <= (ckpt_one + plain_one) / 2
    # a set micro-batch that fits only with checkpointing is kept, with checkpointing switched on
    set_eight = _cfg("train.micro_batch_size=8", 'generation.backend="hf"')
    ckpt_eight = mb.node_plan(set_eight, SMOL, "cpu", micro_batch=8, checkpointing=True).total
    plain_eight = mb.node_plan(set_eight, SMOL, "cpu", micro_batch=8, checkpointing=False).total
    kept = mb.fit(set_eight, SMOL, _budget((ckpt_eight + plain_eight) / 2 / GIB))
    assert (kept.micro_batch, kept.gradient_checkpointing) == (8, True)


def test_a_set_micro_batch_that_does_not_fit_is_refused_with_the_one_that_does():
    cfg = _cfg("train.micro_batch_size=8", 'generation.backend="hf"')
    budget = mb.node_plan(cfg, SMOL, "cpu", micro_batch=8, checkpointing=True,
                         prompt_tokens=128).total - GIB // 4  # 8 never fits
    plain = {m: mb.node_plan(cfg, SMOL, "cpu", micro_batch=m, checkpointing=False, prompt_tokens=128).total
             for m in range(1, 9)}
    largest = max(m for m, total in plain.items() if total <= budget)
    assert 1 <= largest < 8
    with pytest.raises(InputError) as e:
        mb.fit(cfg, SMOL, _budget(budget / GIB), prompt_tokens=128)
    line = e.value.line()
    assert "train.micro_batch_size=8 needs" in line and f"set train.micro_batch_size={largest} (" in line
    assert "\n" not in line


def test_nothing_fits_names_what_would():
    cfg = _cfg('generation.backend="hf"')
    smallest = mb.node_plan(cfg, SMOL, "cpu", micro_batch=1, checkpointing=True).total
    with pytest.raises(InputError) as e:
        mb.fit(cfg, SMOL, _budget(smallest / GIB - 0.05))
    line = e.value.line()
    assert "does not fit" in line and "model.lora.enabled=true" in line and "\n" not in line
    assert "generation.max_new_tokens=128" in line and "parameters" in line  # a smaller model
    lora = _cfg('generation.backend="hf"', "model.lora.enabled=true")
    assert mb.node_plan(lora, SMOL, "cpu", micro_batch=1, checkpointing=True).total < smallest - 0.05 * GIB
    with pytest.raises(InputError) as e:  # nothing at all fits: only a smaller model or machine is left
        mb.fit(cfg, SMOL, _budget(0.3))
    assert "model.lora" not in e.value.line() and "smaller model" in e.value.line()


def test_preflight_sets_the_picked_micro_batch(monkeypatch, tmp_path):
    monkeypatch.setattr(mb, "machine_budget", lambda device: _budget(100))
    cfg = NodeConfig.load(None, ['model.name="tiny-random:64x1"', "train.micro_batch_size=0", "generation.group_size=6"])
    preflight.fit_memory(cfg, None)
    assert cfg.train.micro_batch_size == 6 and not cfg.train.gradient_checkpointing


def test_train_refuses_before_loading_the_model(capsys, monkeypatch, tmp_path):
    from swarm_node.policy import models

    def no_load(*_a, **_k):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(models, "load_policy", no_load)
    monkeypatch.setattr(mb, "machine_budget", lambda device: _budget(0.05))
    code, _, err = run(capsys, "train", "-s", "model.name=tiny-random:64x1:a", "-s",
                       f"model.cache_dir={json.dumps(str(tmp_path / 'cache'))}", "--node-dir", str(tmp_path / "n"))
    errors = [ln for ln in err if ln.startswith("swarm-node: error:")]
    assert code == 2 and len(errors) == 1 and "does not fit" in errors[0] and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "cache").exists()


# Qwen2.5-1.5B(-Instruct)'s config.json sizes: 12 query heads share 2 key/value heads, 152k vocabulary
QWEN_1_5B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536,
             "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True}
GPU_80GB = mb.Budget("cuda", int(79.2 * GIB), int(79.2 * GIB), "GPU memory (cuda:0)")


def _saved_bytes(model: torch.nn.Module, rows: int, prompt: int, completion: int) -> int:
    """Bytes of the distinct storages autograd saves for the backward pass of the scorer's grad pass."""
    from swarm_node.policy.scoring import token_logprobs

    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 250, (prompt,), generator=gen)
    completions = [torch.randint(3, 250, (completion,), generator=gen) for _ in range(rows)]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(model, [ids] * rows, completions, 1.0, rows)
    return sum(seen.values())


def test_grouped_heads_expanded_by_sdpa_are_counted():
    """Qwen2.5 shares each key/value head across 6-7 query heads; under a mask SDPA expands them to every
    query head and autograd keeps the copies. Counted on a 7:1 model built in code, the plan's
    activations (plus the saved logits) match what autograd keeps; without the expansion they would
    fall short by far more than the calibration's spread."""
    from swarm_node.policy import tiny

    name, rows, prompt, completion = "tiny-random:224x2-g7", 4, 96, 64
    model = tiny.build_tiny_model(tiny.parse_tiny_spec(name), tiny.build_tiny_tokenizer("a"))
    shape = mb.model_shape_of_name(name)
    assert (shape.heads, shape.kv_heads) == (7, 1)
    saved = _saved_bytes(model, rows, prompt, completion)
    planned = plan(rows, shape=shape, prompt=prompt, completion=completion).by_name()["activations"]
    logits = rows * completion * shape.vocab * 4  # [b, T, V] float32, saved by sampled_logprobs
    expanded = shape.layers * rows * (prompt + completion) * shape.heads * shape.head_dim * (4 + 4)
    assert 0.93 < saved / (planned + logits) < 1.07
    assert saved / (planned - expanded + logits) > 1.15
    ungrouped = ModelShape(**{**shape.__dict__, "kv_heads": shape.heads})
    with_own_heads = plan(rows, shape=ungrouped, prompt=prompt, completion=completion).by_name()["activations"]
    assert with_own_heads < planned + expanded  # no grouping: nothing to expand


def test_a_gpu_plan_keeps_headroom_and_the_fit_a_margin():
    """Qwen2.5-1.5B full fine-tuning with vLLM at half of an 80 GB GPU: the plan holds the allocator's
    reserve, the CUDA context, vLLM's CUDA graphs and the spot-check's pass, and the micro-batch picked
    leaves FIT_MARGIN of the GPU free (the plan before them took micro-batch 7 at 79.0 of 79.2 GiB)."""
    qwen = ModelShape.from_config(QWEN_1_5B)
    assert round(qwen.params / 1e9, 2) == 1.54
    cfg = _cfg('model.name="Qwen/Qwen2.5-1.5B-Instruct"', 'generation.backend="vllm"',
               "generation.vllm_gpu_memory_utilization=0.5", "train.micro_batch_size=0")
    chosen = mb.fit(cfg, qwen, GPU_80GB)
    parts = chosen.plan.by_name()
    assert parts["baseline"] == memory.CUDA_CONTEXT_BYTES and parts["CUDA graphs"] == memory.VLLM_CUDA_GRAPH_BYTES
    assert parts["generator"] == int(0.5 * GPU_80GB.total) and parts["spot-check"] > 0
    assert parts["reserve (train)"] > 0 and 0.45 < parts["compute copy"] / parts["weights"] < 0.5  # bf16
    assert GPU_80GB.margin == int(0.1 * GPU_80GB.total)
    assert chosen.plan.total <= GPU_80GB.available - GPU_80GB.margin
    bigger = mb.node_plan(cfg, qwen, "cuda", micro_batch=chosen.micro_batch + 1,
                          checkpointing=chosen.gradient_checkpointing, gpu_total=GPU_80GB.total)
    assert bigger.total > GPU_80GB.usable  # the largest that leaves the margin free
    eager = _cfg('generation.backend="vllm"', "generation.vllm_enforce_eager=true")
    assert "CUDA graphs" not in mb.node_plan(eager, qwen, "cuda", micro_batch=1, gpu_total=GPU_80GB.total).by_name()
    # a GPU without bf16 (V100, T4): the trainer computes in float32, so the plan does
    no_bf16 = mb.node_plan(cfg, qwen, "cuda", micro_batch=1, gpu_total=GPU_80GB.total, bf16=False).by_name()
    assert "compute copy" not in no_bf16 and no_bf16["logits"] > mb.node_plan(
        cfg, qwen, "cuda", micro_batch=1, gpu_total=GPU_80GB.total).by_name()["logits"]
    assert "kept free" in GPU_80GB.describe() and "kept free" not in _budget(8).describe()  # no margin on a CPU


def test_the_spot_check_pass_is_planned_in_the_nodes_compute_dtype():
    cfg = _cfg('generation.backend="hf"', "swarm.spot_check.completions=4", "generation.max_new_tokens=256")
    on = mb.node_plan(cfg, SMOL, "cuda", micro_batch=1, prompt_tokens=100, gpu_total=80 * GIB).by_name()
    bf16_logits = 4 * 256 * SMOL.vocab * 2  # [4 completions, 256, V] in bf16: no float32 copy of them
    assert on["spot-check"] > bf16_logits and on["spot-check"] < bf16_logits + 2 * 4 * 256 * SMOL.vocab * 2 + GIB
    for off in ("swarm.enabled=false", "swarm.spot_check.enabled=false"):
        assert "spot-check" not in mb.node_plan(_cfg(off), SMOL, "cuda", micro_batch=1, gpu_total=80 * GIB).by_name()


def test_a_model_not_in_the_cache_is_planned_from_its_config_alone(monkeypatch, tmp_path, caplog):
    import huggingface_hub

    fetched = []

    def config_only(repo_id, filename, revision=None, **_):  # the hub, serving only config.json
        fetched.append((repo_id, filename))
        (tmp_path / "config.json").write_text(json.dumps(QWEN_1_5B))
        return str(tmp_path / "config.json")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", config_only)
    monkeypatch.setattr(mb, "machine_budget", lambda device: GPU_80GB)
    cfg = NodeConfig.load(None, ['model.name="Qwen/Qwen2.5-1.5B-Instruct"', "train.micro_batch_size=0",
                                 'generation.backend="vllm"', "generation.vllm_gpu_memory_utilization=0.5"])
    with caplog.at_level("INFO", logger="swarm_node.node.preflight"):
        preflight.fit_memory(cfg, None)
    assert fetched == [("Qwen/Qwen2.5-1.5B-Instruct", "config.json")]
    expected = mb.fit(cfg.model_copy(update={"train": cfg.train.model_copy(update={"micro_batch_size": 0})}),
                      ModelShape.from_config(QWEN_1_5B), GPU_80GB)
    assert cfg.train.micro_batch_size == expected.micro_batch < 8  # planned, not the default 8
    assert "fetched from the hub" in caplog.text

    def offline(*_a, **_k):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    cfg = NodeConfig.load(None, ['model.name="Qwen/Qwen2.5-1.5B-Instruct"', "train.micro_batch_size=0"])
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("swarm_node.node.preflight").addHandler(handler)
    try:
        preflight.fit_memory(cfg, None)
    finally:
        logging.getLogger("swarm_node.node.preflight").removeHandler(handler)
    lines = [r.getMessage() for r in records]
    assert cfg.train.micro_batch_size == 8 and len(lines) == 1 and "\n" not in lines[0]
    assert "could not be fetched from the hub (OSError: We couldn't connect" in lines[0]
