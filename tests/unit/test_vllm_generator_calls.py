"""VLLMGenerator's calls into vLLM, against a fake `vllm` module (no vLLM, no GPU): a node on cuda:1
builds its engine there with CUDA graphs and sleep mode; the engine sleeps after every call and
wakes before the next call or a weight sync; weight syncs cast every tensor to the engine's dtype;
greedy decoding asks for temperature 0 with the policy's stop tokens."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swarm_node.config import GenerationConfig
from swarm_node.policy.vllm_engine import EngineDemand


class FakeLLM:
    """Records every call the generator makes; generates one fixed completion per request."""

    calls: list[tuple] = []
    kwargs: dict = {}

    def __init__(self, **kwargs: object) -> None:
        FakeLLM.kwargs = kwargs
        FakeLLM.calls = []

    def generate(self, prompts, params, use_tqdm=False, lora_request=None):
        FakeLLM.calls.append(("generate", len(prompts)))
        plist = params if isinstance(params, list) else [params] * len(prompts)
        out = []
        for p in plist:
            outputs = [SimpleNamespace(index=i, token_ids=[5, 9], finish_reason="stop",
                                       logprobs=[{5: SimpleNamespace(logprob=-0.5)}, {9: SimpleNamespace(logprob=-0.25)}])
                       for i in range(p.n)]
            out.append(SimpleNamespace(outputs=outputs))
        return out

    def collective_rpc(self, method, kwargs=None):
        if method == "reload_weights":
            FakeLLM.calls.append(("reload", sorted({t.dtype for _, t in kwargs["weights_iterator"]}, key=str)))
        return [False]

    def reset_prefix_cache(self) -> bool:
        return True

    def sleep(self, level: int = 1) -> None:
        FakeLLM.calls.append(("sleep", level))

    def wake_up(self, tags=None) -> bool:
        FakeLLM.calls.append(("wake_up", tags))
        return True

    @property
    def llm_engine(self) -> SimpleNamespace:
        return SimpleNamespace(engine_core=SimpleNamespace(shutdown=lambda: FakeLLM.calls.append(("shutdown",))))


@dataclasses.dataclass
class FakeEngineArgs:
    model: str = ""
    device_ids: list[int] | None = None


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM
    vllm.EngineArgs = FakeEngineArgs
    vllm.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    vllm.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = SimpleNamespace(is_sleep_mode_available=lambda: True,
                                                 visible_device_id_to_physical_device_id=lambda i: i)
    platforms.interface = SimpleNamespace(get_assigned_physical_gpu_ids=lambda: None)
    vllm.platforms = platforms
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return vllm


def gpu_policy(index: int) -> SimpleNamespace:
    """What VLLMGenerator reads of a Policy, on cuda:<index> (nothing touches the device here)."""
    model = torch.nn.Linear(4, 3)  # float32 parameters: the trainer's master weights
    return SimpleNamespace(device=torch.device(f"cuda:{index}"), local_path=Path("/models/m"), is_lora=False,
                           model=model, stop_token_ids=[2, 7])


def test_a_node_on_cuda1_sleeps_between_calls_and_syncs_in_the_engines_dtype(fake_vllm) -> None:
    from swarm_node.policy.vllm_generator import VLLMGenerator

    cfg = GenerationConfig(vllm_sleep=True, dtype="bfloat16", max_new_tokens=6)
    gen = VLLMGenerator(gpu_policy(1), cfg, seed=0, demand=EngineDemand(sequences=24, max_new_tokens=6))
    kw = FakeLLM.kwargs
    assert kw["device_ids"] == [1] and kw["enable_sleep_mode"] is True and kw["enforce_eager"] is False
    assert (kw["dtype"], kw["max_model_len"], kw["max_num_seqs"]) == ("bfloat16", 1024 + 6, 24)
    assert gen.sleeps and FakeLLM.calls == [("reload", [torch.bfloat16])]  # the first sync, cast to bf16
    groups = gen.generate([[1, 2, 3], [4]], n=3)
    assert [len(g) for g in groups] == [3, 3] and groups[0][0].token_ids.tolist() == [5, 9]
    assert FakeLLM.calls[-2:] == [("generate", 2), ("sleep", 1)]
    gen.sync_weights(torch.nn.Linear(4, 3))  # float32 weights of a trained model
    assert FakeLLM.calls[-2:] == [("wake_up", None), ("reload", [torch.bfloat16])]
    greedy = gen.greedy([[1, 2]], 6, batch_size=4)
    assert greedy[0].token_ids.tolist() == [5, 9] and greedy[0].finish_reason == "stop"
    assert FakeLLM.calls[-2:] == [("generate", 1), ("sleep", 1)]  # awake since the sync; asleep after
    gen.generate([[3]], n=1)
    assert FakeLLM.calls[-3:] == [("wake_up", None), ("generate", 1), ("sleep", 1)]


def test_without_sleep_the_engine_stays_awake_and_greedy_is_temperature_zero(fake_vllm, monkeypatch) -> None:
    from swarm_node.policy.vllm_generator import VLLMGenerator

    seen = []
    fake_vllm.SamplingParams = lambda **kw: seen.append(kw) or SimpleNamespace(**kw)
    gen = VLLMGenerator(gpu_policy(0), GenerationConfig(dtype="float32"), seed=0)
    gen.greedy([[1, 2]], 5, batch_size=2)
    gen.generate([[1]], n=2)
    assert not any(c[0] in ("sleep", "wake_up") for c in FakeLLM.calls)
    assert FakeLLM.calls[0] == ("reload", [torch.float32])
    assert seen[0]["temperature"] == 0.0 and seen[0]["max_tokens"] == 5 and seen[0]["stop_token_ids"] == [2, 7]
    assert seen[1]["temperature"] == 1.0 and seen[1]["n"] == 2 and seen[1]["logprobs"] == 0
    # one greedy on every backend: nothing left for the model's generation config to set
    assert FakeLLM.kwargs["generation_config"] == "vllm"
    for params in seen:
        assert (params["repetition_penalty"], params["top_k"], params["min_p"], params["presence_penalty"],
                params["frequency_penalty"]) == (1.0, 0, 0.0, 0.0, 0.0)


def test_sleep_is_refused_quietly_where_vllm_lacks_it_and_another_gpu_is_refused(fake_vllm, caplog) -> None:
    from swarm_node.policy.vllm_generator import VLLMGenerator

    fake_vllm.platforms.current_platform.is_sleep_mode_available = lambda: False
    gen = VLLMGenerator(gpu_policy(0), GenerationConfig(vllm_sleep=True), seed=0)
    assert not gen.sleeps and "enable_sleep_mode" not in FakeLLM.kwargs
    assert "reports no sleep mode" in caplog.text
    # an engine on GPU 0 already runs in this process: one for cuda:1 cannot start beside it
    fake_vllm.platforms.interface.get_assigned_physical_gpu_ids = lambda: [0]
    with pytest.raises(ValueError, match="separate processes"):
        VLLMGenerator(gpu_policy(1), GenerationConfig(), seed=0)


def lora_policy(device: str) -> SimpleNamespace:
    """What VLLMGenerator reads of a LoRA Policy before its engine starts."""
    return SimpleNamespace(device=torch.device(device), local_path=Path("/models/m"), is_lora=True,
                           model=torch.nn.Linear(4, 3), stop_token_ids=[2])


def test_merged_lora_sync_needs_a_float32_engine(fake_vllm, monkeypatch) -> None:
    from swarm_node.policy import generation
    from swarm_node.policy.generation import make_generator
    from swarm_node.policy.vllm_engine import lora_sync_problem
    from swarm_node.policy.vllm_generator import VLLMGenerator
    from swarm_node.util.errors import InputError

    merged = GenerationConfig(vllm_lora_sync="merged", dtype="bfloat16")
    FakeLLM.kwargs = {}
    with pytest.raises(InputError) as e:
        VLLMGenerator(lora_policy("cuda:0"), merged, seed=0)
    assert "vllm_lora_sync='adapter'" in e.value.line() and "\n" not in e.value.line()
    assert FakeLLM.kwargs == {}  # refused before an engine started
    monkeypatch.setattr(generation, "vllm_installed", lambda: True)  # the fake module has no import spec
    with pytest.raises(InputError):  # auto does not fall back over a setting the user must fix
        make_generator(lora_policy("cpu"), GenerationConfig(backend="auto", vllm_lora_sync="merged", dtype="float16"))
    assert lora_sync_problem(GenerationConfig(vllm_lora_sync="merged"), torch.device("cpu"), True) is None  # float32
    assert lora_sync_problem(GenerationConfig(vllm_lora_sync="merged", dtype="float32"), torch.device("cuda"),
                             True) is None
    assert lora_sync_problem(GenerationConfig(vllm_lora_sync="adapter"), torch.device("cuda"), True) is None
    assert lora_sync_problem(merged, torch.device("cuda"), False) is None  # full fine-tuning: no adapter to lose
    assert "rounds each merged weight" in lora_sync_problem(GenerationConfig(vllm_lora_sync="merged"),
                                                            torch.device("cuda"), True)  # auto on CUDA: 16 bits


def test_merged_weights_keep_a_delta_below_the_bases_ulp() -> None:
    """A bf16 frozen base plus an adapter one small step away from zero: merged in float32 the delta is
    all there; added in bf16 it would round away entirely."""
    from peft import LoraConfig, get_peft_model

    from swarm_node.policy.vllm_generator import merged_named_weights

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(64, 64, bias=False)

    torch.manual_seed(0)
    base = Tiny()
    with torch.no_grad():
        base.proj.weight.uniform_(0.01, 0.02)  # weights of about 0.015: half a bf16 ulp is about 3e-5
    base = base.to(torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=16, target_modules=["proj"]))
    layer = model.get_base_model().proj
    with torch.no_grad():
        layer.lora_B["default"].weight.fill_(5e-6)  # one Adam step at lr 5e-6 from B = 0
    delta = layer.get_delta_weight("default").float()
    assert 0 < delta.abs().max() < 1e-4
    merged = dict(merged_named_weights(model))["proj.weight"]
    original = layer.base_layer.weight.float()
    assert merged.dtype == torch.float32
    torch.testing.assert_close(merged - original, delta, rtol=1e-3, atol=1e-9)
    in_bf16 = (layer.base_layer.weight + layer.get_delta_weight("default").to(torch.bfloat16)).float()
    assert torch.equal(in_bf16, original)  # the old bf16 addition: the adapter erased


def test_auto_closes_an_engine_that_started_and_then_failed(fake_vllm, monkeypatch) -> None:
    from swarm_node.policy import generation
    from swarm_node.policy.generation import HFGenerator, make_generator

    monkeypatch.setattr(generation, "vllm_installed", lambda: True)  # the fake module has no import spec
    def failing_reload(self, method, kwargs=None):
        if method == "reload_weights":
            raise RuntimeError("reload failed")
        return [False]

    fake_vllm.LLM = type("FailingLLM", (FakeLLM,), {"collective_rpc": failing_reload})
    policy = SimpleNamespace(device=torch.device("cpu"), local_path=Path("/models/m"), is_lora=False,
                             model=torch.nn.Linear(4, 3), stop_token_ids=[2], pad_token_id=0)
    generator = make_generator(policy, GenerationConfig(backend="auto"))
    assert isinstance(generator, HFGenerator) and FakeLLM.calls == [("shutdown",)]
