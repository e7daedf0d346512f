"""Receiving a foreign completion (swarm_node.peers.crosstok_receive): own tokens, chunks and per-chunk
generator logprobs; round-trip and byte checks drop with counted reasons; the trained tiny tokenizer."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from swarm_node.method.crosstok import chunk_logprobs
from swarm_node.peers.crosstok_receive import (
    DROP_NO_TEXT,
    DROP_PIECE_BYTES,
    DROP_TEXT_ROUNDTRIP,
    DROP_TEXT_TOO_LONG,
    own_piece_bytes,
    receive_completion,
    receive_group,
    train_samples,
)
from swarm_node.policy import tiny
from swarm_node.policy.models import tokenizer_fingerprint
from swarm_node.tasks.prompts import render_prompt

TEXT = "So 12 + 345 = 357, and 7 * 8 = 56 \u20ac \u00fc.\n\\boxed{357}"


@dataclass
class Sent:
    """A stand-in for the wire completion: the fields the receiver reads."""

    text: str
    piece_bytes: np.ndarray
    logprobs: np.ndarray
    finish_reason: str


def send(sender, text: str, finish: str = "stop", seed: int = 0) -> tuple[list[int], Sent]:
    """What a sender with tokenizer `sender` publishes for `text` (its EOS after "stop")."""
    ids = sender.encode(text, add_special_tokens=False)
    pieces = own_piece_bytes(sender, ids, text)
    assert pieces is not None
    if finish == "stop":
        ids, pieces = [*ids, sender.eos_token_id], np.append(pieces, 0)
    logprobs = -np.random.default_rng(seed).uniform(0.01, 3.0, len(ids)).astype(np.float32)
    return ids, Sent(text, pieces.astype(np.uint16), logprobs, finish)


@pytest.fixture(scope="module")
def tok():
    return {v: tiny.build_tiny_tokenizer(v) for v in ("a", "b", "c")}


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_same_tokenizer_is_token_for_token(tok, finish: str) -> None:
    for v in ("a", "b", "c"):
        ids, sent = send(tok[v], TEXT, finish)
        got = receive_completion(tok[v], tok[v].eos_token_id, sent)
        assert got.reason is None and got.own_tokens == len(ids)
        view = got.view
        assert view.completion_ids.tolist() == ids
        assert view.chunk_ids.tolist() == list(range(len(ids))) and view.n_chunks == len(ids)
        assert np.array_equal(view.generator_logprobs, sent.logprobs)  # bit for bit


@pytest.mark.parametrize(("sender", "receiver"), [("a", "c"), ("c", "b"), ("b", "a")])
def test_foreign_completion_in_own_tokens(tok, sender: str, receiver: str) -> None:
    ids, sent = send(tok[sender], TEXT)
    own = tok[receiver]
    got = receive_completion(own, own.eos_token_id, sent)
    assert got.reason is None
    view = got.view
    assert view.completion_ids[-1] == own.eos_token_id
    assert own.decode(view.completion_ids.tolist(), skip_special_tokens=True) == TEXT
    assert view.n_chunks < max(len(ids), len(view.completion_ids))  # some chunks hold several tokens
    # the generator's chunk logprobs: sums of the sender's token logprobs over aligned byte spans
    per_chunk = chunk_logprobs(view.generator_logprobs, view.chunk_ids, view.n_chunks)
    from swarm_node.method.crosstok import align

    alignment = align(sent.piece_bytes, own_piece_bytes(own, view.completion_ids[:-1].tolist(), TEXT).tolist() + [0])
    expected = chunk_logprobs(sent.logprobs, alignment.chunks_a, alignment.n_chunks)
    assert np.allclose(per_chunk, expected, rtol=1e-6)
    assert per_chunk[-1] == pytest.approx(float(sent.logprobs[-1]))  # the EOS chunk pairs the two EOS
    # shares sit on each chunk's last own token
    last = np.append(view.chunk_ids[1:] != view.chunk_ids[:-1], True)
    assert np.all(view.generator_logprobs[~last] == 0)


def wordpiece_tokenizer() -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer (not byte-level) whose vocabulary lacks most characters."""
    vocab = {"[UNK]": 0, "[SEP]": 1, "ab": 2, "cd": 3, "##e": 4, "1": 5, "2": 6}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="[SEP]")


def test_text_the_own_tokenizer_cannot_reproduce_is_dropped(tok) -> None:
    wp = wordpiece_tokenizer()
    _, sent = send(tok["a"], "ab cde \u20ac")  # the euro sign is unknown to the WordPiece vocabulary
    got = receive_completion(wp, wp.eos_token_id, sent)
    assert got.view is None and got.reason == DROP_TEXT_ROUNDTRIP and got.own_tokens == 4 + 1
    _, sent = send(tok["a"], "ab cde")  # representable: decoded from growing prefixes
    got = receive_completion(wp, wp.eos_token_id, sent)
    assert got.reason is None and got.view.completion_ids.tolist() == [2, 3, 4, 1]
    assert own_piece_bytes(wp, [2, 3, 4], "ab cde").tolist() == [2, 3, 1]
    # special tokens spelled out in the text never round-trip
    text = "x<|im_end|>y"  # from a sender without that special token: one piece per byte
    sent = Sent(text, np.ones(len(text), np.uint16), np.full(len(text), -1.0, np.float32), "length")
    got = receive_completion(tok["c"], tok["c"].eos_token_id, sent)
    assert got.reason == DROP_TEXT_ROUNDTRIP


def test_malformed_sender_fields_are_dropped(tok) -> None:
    _, sent = send(tok["a"], "12 + 3")
    own = tok["c"]
    bad_sum = Sent(sent.text, sent.piece_bytes + 1, sent.logprobs, "stop")
    bad_len = Sent(sent.text, sent.piece_bytes[:-1], sent.logprobs, "stop")
    not_sent = Sent("", np.zeros(0, np.uint16), sent.logprobs, "stop")
    surrogate = Sent("\ud800", np.array([3, 0], np.uint16), sent.logprobs[:2], "stop")
    for bad, reason in ((bad_sum, DROP_PIECE_BYTES), (bad_len, DROP_PIECE_BYTES), (not_sent, DROP_PIECE_BYTES),
                        (surrogate, DROP_TEXT_ROUNDTRIP)):
        got = receive_completion(own, own.eos_token_id, bad)
        assert got.view is None and got.reason == reason
    empty_length = Sent("", np.zeros(1, np.uint16), np.full(1, -0.5, np.float32), "length")
    assert receive_completion(own, own.eos_token_id, empty_length).reason == DROP_NO_TEXT
    empty_stop = Sent("", np.zeros(1, np.uint16), np.full(1, -0.5, np.float32), "stop")  # only EOS
    got = receive_completion(own, own.eos_token_id, empty_stop)
    assert got.view.completion_ids.tolist() == [own.eos_token_id] and got.view.generator_logprobs.tolist() == [-0.5]
    long = receive_completion(own, own.eos_token_id, sent, max_own_tokens=2)
    assert long.reason == DROP_TEXT_TOO_LONG and long.own_tokens > 2


def test_a_group_is_used_whole_or_not_at_all(tok) -> None:
    own = tok["c"]
    good = [send(tok["a"], t, seed=i)[1] for i, t in enumerate(("12 + 3 = 15", "The answer is 4", "no"))]
    got = receive_group(own, own.eos_token_id, good)
    assert got.reason is None and len(got.views) == 3
    assert got.own_tokens == sum(v.own_tokens for v in got.views)
    samples = train_samples(got.views, [1.0, 0.0, 0.0], prompt_ids=np.array([1, 5, 7]), group_key="peer:3:9",
                            source="peer", record_id="r1")
    s = samples[0]
    assert s.is_peer and s.chunk_ids is not None and s.reward == 1.0 and s.record_id == "r1"
    assert [x.reward for x in samples] == [1.0, 0.0, 0.0] and s.prompt_ids.tolist() == [1, 5, 7]
    assert len(s.chunk_ids) == len(s.completion_ids) == len(s.generator_logprobs)
    broken = [*good[:2], Sent("\u20ac", np.array([2, 0], np.uint16), np.full(2, -1.0, np.float32), "stop")]
    got = receive_group(own, own.eos_token_id, broken)
    assert got.views == [] and got.reason == DROP_PIECE_BYTES and got.own_tokens > 0


def test_trained_tiny_tokenizer_is_deterministic(tok) -> None:
    c = tok["c"]
    assert len(c) == tiny.TRAINED_VOCAB_SIZE
    assert c.convert_ids_to_tokens([0, 1, 2]) == list(tiny.SPECIALS)
    assert tokenizer_fingerprint(c) == tokenizer_fingerprint(tiny.build_tiny_tokenizer("c"))
    assert tokenizer_fingerprint(c) not in {tokenizer_fingerprint(tok["a"]), tokenizer_fingerprint(tok["b"])}
    code = ("from swarm_node.policy import tiny; from swarm_node.policy.models import tokenizer_fingerprint; "
            "print(tokenizer_fingerprint(tiny.build_tiny_tokenizer('c')))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "RAYON_NUM_THREADS": "1", "PATH": "",
                                "PYTHONPATH": ":".join(p for p in sys.path if p)})
    assert other.stdout.strip() == tokenizer_fingerprint(c)  # another process, hash seed, thread count
    assert len(c.encode("What is 123 + 456? The answer is 579.", add_special_tokens=False)) < 16  # merges learnt


def test_trained_tiny_model_loads_by_id(tmp_path) -> None:
    from swarm_node.config import ModelConfig
    from swarm_node.policy.models import load_policy

    policy = load_policy(ModelConfig(name="tiny-random:32x1:c", cache_dir=tmp_path, device="cpu"))
    assert policy.fingerprint == tokenizer_fingerprint(tiny.build_tiny_tokenizer("c"))
    assert policy.model.config.vocab_size == tiny.TRAINED_VOCAB_SIZE
    prompt = render_prompt(policy.tokenizer, "1+1?")
    assert policy.tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
