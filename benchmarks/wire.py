"""Wire-format size and speed of rollout groups, comparing compression schemes in one run.

    python -m benchmarks.wire                     # synthetic groups: G=8 x 256 tokens
    python -m benchmarks.wire --rollouts FILE     # groups from a rollout file (codec.write_rollout_file)
    python -m benchmarks.wire --quick             # 2 synthetic groups of G=8 x 64 tokens, short timings

Each run also measures completion text (cross-tokenizer exchange, `Completion.text` /
`piece_bytes`): `text` reports bytes per token with and without text in the default scheme, and
checks that a group without text costs at most `V2_EXTRA_BYTES_PER_GROUP` more than in protocol
version 1 uncompressed (`V2_EXTRA_COMPRESSED_BYTES_PER_GROUP` in the default scheme). Rollout files
from `benchmarks.collect_rollouts` hold text; a file without text is measured without it.
Synthetic text: each token id stands for a fixed piece of 1-10 letters (mean about 4 bytes, like
an English BPE vocabulary), so equal tokens give equal text, as with a real tokenizer.

Synthetic data: token ids Zipf-like (s=1.1) over a 49,152-token vocabulary, ranks mapped to ids by a
fixed random permutation (so ids carry no "frequent = small" help); logprobs like an LM's sampled
tokens: 80% -exp(N(-4, 2)) (near 0), 20% -exp(N(0.5, 1)) (heavy tail), clipped to [-30, 0], float32.
Sizes include the 9-byte header and every field. Speeds are MB of uncompressed message (the size
with scheme NONE) per second, single thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable

import numpy as np
import zstandard

from benchmarks.common import emit, parse_args
from protocol import codec
from protocol.schema import shuffle_bytes
from protocol.codec import Scheme, decode, encode
from protocol.messages import PROTOCOL_VERSION, Completion, PromptRef, RolloutGroup, SamplingParams

VOCAB = 49_152
V2_EXTRA_BYTES_PER_GROUP = 1
"""The most a version-2 group without text may take over the same group in version 1, uncompressed.
Version 2 added one field to every group body, the adapter digest; a full-weights node's is empty,
which msgpack writes in one byte, and the text fields are written only when a completion carries
text. (A LoRA node's digest, 64 hex characters, is information version 1 cannot carry: the
comparison leaves it out.)"""
V2_EXTRA_COMPRESSED_BYTES_PER_GROUP = 32
"""The same bound in the default scheme. zstd codes a body shifted by that byte a little differently,
either way: +1 in every synthetic group; +2 and +6 in the two groups of real SmolLM2 rollouts, and
-4 to +13 over 300 groups made from them (subsets of their completions cut to random lengths).
32 bytes is under 1% of such a group (4-5 KB)."""


def synthetic_vocabulary(seed: int = 1) -> list[bytes]:
    """A piece of text for every token id: 1-10 bytes (mean ~4), lowercase letters, a leading space
    on about half of them (as byte-level BPE pieces of words are)."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"etaoinshrdlucmfwypvbgkjqxz", np.uint8)
    freq = 1.0 / np.arange(1, letters.size + 1)
    freq /= freq.sum()
    out = []
    for _ in range(VOCAB):
        n = int(np.clip(rng.poisson(3.0) + 1, 1, 10))
        word = bytes(rng.choice(letters, size=n, p=freq).tolist())
        out.append(b" " + word[1:] if rng.random() < 0.5 and n > 1 else word)
    return out


def synthetic_groups(n_groups: int, group_size: int, tokens: int, seed: int = 0) -> list[RolloutGroup]:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
    p = ranks**-1.1
    p /= p.sum()
    perm = rng.permutation(VOCAB).astype(np.uint32)
    vocab = synthetic_vocabulary()
    out = []
    for g in range(n_groups):
        comps = []
        for _ in range(group_size):
            ids = perm[rng.choice(VOCAB, size=tokens, p=p)]
            near = -np.exp(rng.normal(-4.0, 2.0, tokens))
            tail = -np.exp(rng.normal(0.5, 1.0, tokens))
            lp = np.clip(np.where(rng.random(tokens) < 0.8, near, tail), -30.0, 0.0).astype(np.float32)
            pieces = [vocab[i] for i in ids.tolist()]
            comps.append(Completion(token_ids=ids, logprobs=lp, finish_reason="length", claimed_reward=0.0,
                                    text=b"".join(pieces).decode(), piece_bytes=[len(x) for x in pieces]))
        out.append(RolloutGroup(
            swarm_id="bench-swarm", sender="12D3KooWBenchmarkPeerIdentifier00000000000000000",
            model_id="HuggingFaceTB/SmolLM2-135M-Instruct", model_revision="main",
            tokenizer_fingerprint="sha256:" + "0f" * 16, policy_version=1234, created_at=1.7e9 + g,
            prompt=PromptRef(prompt_set_id="gsm8k-train", index=g, sha256="ab" * 32),
            sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=tokens), completions=comps,
        ))
    return out


def _split_streams(g: RolloutGroup) -> bytes:
    """Benchmark-only variant: shuffled tokens and logprobs as two separate zstd frames, plus the
    rest of the message uncompressed (its size stands in for the metadata; not decodable)."""
    z = zstandard.ZstdCompressor(level=3)
    tok = b"".join(c.token_ids.tobytes() for c in g.completions)
    lp = b"".join(c.logprobs.tobytes() for c in g.completions)
    meta = len(encode(g, Scheme.NONE)) - len(tok) - len(lp)
    return z.compress(shuffle_bytes(tok)) + z.compress(shuffle_bytes(lp)) + bytes(meta)


def _timed(fn: Callable[[], object], min_seconds: float) -> float:
    """Seconds per call of fn, repeated until min_seconds elapsed."""
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls


def measure(groups: list[RolloutGroup], min_seconds: float) -> dict[str, object]:
    n_tokens = sum(g.num_tokens for g in groups)
    raw_bytes = sum(len(encode(g, Scheme.NONE)) for g in groups)
    variants: dict[str, Callable[[RolloutGroup], bytes]] = {
        "none": lambda g: encode(g, Scheme.NONE),
        "zstd_l3": lambda g: encode(g, Scheme.ZSTD, level=3),
        "zstd_l19": lambda g: encode(g, Scheme.ZSTD, level=19),
        "shuffle_zstd_l1": lambda g: encode(g, Scheme.SHUFFLE_ZSTD, level=1),
        "shuffle_zstd_l3": lambda g: encode(g, Scheme.SHUFFLE_ZSTD, level=3),
        "shuffle_zstd_l9": lambda g: encode(g, Scheme.SHUFFLE_ZSTD, level=9),
        "shuffle_zstd_l19": lambda g: encode(g, Scheme.SHUFFLE_ZSTD, level=19),
        "split_streams_l3_estimate": _split_streams,
    }
    schemes: dict[str, dict[str, float]] = {}
    for name, enc in variants.items():
        blobs = [enc(g) for g in groups]
        row = {"bytes_per_token": round(sum(map(len, blobs)) / n_tokens, 4),
               "ratio_vs_raw": round(sum(map(len, blobs)) / raw_bytes, 4)}
        if not name.startswith("split"):
            assert all(decode(b) == g for b, g in zip(blobs, groups, strict=True)), name  # lossless
            t_enc = _timed(lambda enc=enc: [enc(g) for g in groups], min_seconds)
            t_dec = _timed(lambda blobs=blobs: [decode(b) for b in blobs], min_seconds)
            row["encode_mb_s"] = round(raw_bytes / t_enc / 1e6, 2)
            row["decode_mb_s"] = round(raw_bytes / t_dec / 1e6, 2)
        schemes[name] = row
    default_blobs = [encode(g) for g in groups]
    t_enc = _timed(lambda: [encode(g) for g in groups], min_seconds)
    t_dec = _timed(lambda: [decode(b) for b in default_blobs], min_seconds)
    tokens = np.concatenate([c.token_ids for g in groups for c in g.completions])
    counts = np.bincount(tokens)
    freq = counts[counts > 0] / tokens.size
    return {
        "groups": len(groups),
        "tokens": n_tokens,
        "bytes_per_token_raw": round(raw_bytes / n_tokens, 4),
        "bytes_per_token": round(sum(map(len, default_blobs)) / n_tokens, 4),
        "default_scheme": f"{codec.DEFAULT_SCHEME.name.lower()}_l{codec.ZSTD_LEVEL}",
        "default_ratio_vs_raw": round(sum(map(len, default_blobs)) / raw_bytes, 4),
        "encode_mb_s": round(raw_bytes / t_enc / 1e6, 2),
        "decode_mb_s": round(raw_bytes / t_dec / 1e6, 2),
        "groups_per_s_decode": round(len(groups) / t_dec, 1),
        "token_id_empirical_entropy_bits": round(float(-(freq * np.log2(freq)).sum()), 3),
        "schemes": schemes,
        "mb_basis": "uncompressed message bytes (scheme none) per second, one thread",
    }


def without_text(group: RolloutGroup, version: int = PROTOCOL_VERSION, adapter: bool = True) -> RolloutGroup:
    """`group` without completion text in protocol `version`; without its adapter digest when
    `adapter` is false or in version 1 (which has no such field)."""
    digest = group.adapter_digest if adapter and version != 1 else ""
    return dataclasses.replace(group, protocol_version=version, adapter_digest=digest, completions=tuple(
        dataclasses.replace(c, text="", piece_bytes=np.zeros(0, np.uint16)) for c in group.completions))


def version2_extra_bytes(groups: list[RolloutGroup]) -> dict[str, float]:
    """Bytes a group without text (and adapter digest) takes in version 2 over version 1: the most,
    uncompressed and in the default scheme, and the mean in the default scheme. Fails above the bounds
    (V2_EXTRA_BYTES_PER_GROUP, V2_EXTRA_COMPRESSED_BYTES_PER_GROUP)."""
    extra = {name: [len(encode(without_text(g, adapter=False), scheme)) - len(encode(without_text(g, 1), scheme))
                    for g in groups] for name, scheme in (("raw", Scheme.NONE), ("default", None))}
    for name, bound in (("raw", V2_EXTRA_BYTES_PER_GROUP), ("default", V2_EXTRA_COMPRESSED_BYTES_PER_GROUP)):
        assert max(extra[name]) <= bound, (f"a version-2 group without text takes {max(extra[name])} bytes "
                                           f"({name}) over version 1, above the bound of {bound}")
    return {"raw_max": max(extra["raw"]), "default_max": max(extra["default"]),
            "default_mean": round(sum(extra["default"]) / len(groups), 2)}


def measure_text(groups: list[RolloutGroup]) -> dict[str, object]:
    """Default-scheme bytes per token with and without completion text, in protocol version 1, and
    what version 2 adds to a group without text (`version2_extra_bytes`)."""
    n_tokens = sum(g.num_tokens for g in groups)
    plain = [without_text(g) for g in groups]
    v1_bytes = sum(len(encode(without_text(g, 1))) for g in groups)
    plain_bytes = sum(len(encode(g)) for g in plain)
    row: dict[str, object] = {
        "bytes_per_token_without_text": round(plain_bytes / n_tokens, 4),
        "bytes_per_token_protocol_v1": round(v1_bytes / n_tokens, 4),
        "v2_extra_bytes_per_group": version2_extra_bytes(groups),
        "v2_extra_bytes_per_group_bound": {"raw": V2_EXTRA_BYTES_PER_GROUP,
                                           "default": V2_EXTRA_COMPRESSED_BYTES_PER_GROUP},
    }
    if all(c.has_text for g in groups for c in g.completions):
        blobs = [encode(g) for g in groups]
        assert all(decode(b) == g for b, g in zip(blobs, groups, strict=True))  # lossless
        text_bytes = sum(len(c.text.encode()) for g in groups for c in g.completions)
        row.update({
            "bytes_per_token_with_text": round(sum(map(len, blobs)) / n_tokens, 4),
            "bytes_per_token_with_text_raw": round(sum(len(encode(g, Scheme.NONE)) for g in groups) / n_tokens, 4),
            "text_overhead_bytes_per_token": round((sum(map(len, blobs)) - plain_bytes) / n_tokens, 4),
            "text_utf8_bytes_per_token": round(text_bytes / n_tokens, 4),
            "target_with_text": 9.0,
        })
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", help="read RolloutGroups from this rollout file instead of synthetic data")
    parser.add_argument("--groups", type=int, default=16, help="synthetic groups")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--min-seconds", type=float, default=0.5, help="timing duration per measurement")
    args = parse_args(parser, {"groups": 2, "tokens": 64, "min_seconds": 0.01})
    if args.rollouts:
        groups = list(codec.read_rollout_file(args.rollouts))
        source = {"source": "file", "path": args.rollouts}
    else:
        groups = synthetic_groups(args.groups, args.group_size, args.tokens)
        source = {"source": "synthetic", "group_size": args.group_size, "tokens_per_completion": args.tokens,
                  "vocab": VOCAB, "targets": {"bytes_per_token_raw": 8.5, "bytes_per_token": 6.0}}
    text = measure_text(groups)
    result = {"benchmark": "wire", **source, **measure([without_text(g) for g in groups], args.min_seconds),
              "text": text}
    for name, row in result["schemes"].items():  # type: ignore[union-attr]
        print(f"{name:28s} {row}")
    print(f"{'text':28s} {text}")
    emit(result)


if __name__ == "__main__":
    main()
