"""Seeded prompt sets over the in-memory transport: round trip and tamper detection."""

from __future__ import annotations

import dataclasses

import pytest

from protocol import codec, keys
from swarm_node.swarm import prompts
from swarm_node.swarm.identity import load_or_create_key
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.prompts import PromptSetError, load_prompt_set, seed_prompt_set
from swarm_node.tasks.base import Problem, PromptSet, content_id

SWARM = "unit"


def _prompt_set(n: int = 50, salt: str = "") -> PromptSet:
    problems = tuple(Problem(index=i, question=f"What is {i} + {i}?{salt}", answer=str(2 * i)) for i in range(n))
    return PromptSet(id=content_id("arithmetic", problems), answer_kind="number", problems=problems)


@pytest.fixture(scope="module")
def operator(tmp_path_factory):
    return load_or_create_key(tmp_path_factory.mktemp("op") / "operator.key")


@pytest.fixture(scope="module")
def stranger(tmp_path_factory):
    return load_or_create_key(tmp_path_factory.mktemp("st") / "stranger.key")


def test_seed_then_load_round_trip(operator, monkeypatch) -> None:
    monkeypatch.setattr(prompts, "MAX_CHUNK_BYTES", 300)  # force several chunks
    swarm = MemorySwarm()
    ps = _prompt_set()
    manifest = seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, ps, "tiny", operator)
    assert len(manifest.chunk_digests) > 3 and manifest.num_problems == 50
    loaded = load_prompt_set(MemoryTransport(swarm, "node"), SWARM, ps.id, operator.public_key.decode(), timeout=1)
    assert loaded == ps
    # Without an operator key the content hash alone still verifies the set.
    assert load_prompt_set(MemoryTransport(swarm, "node2"), SWARM, ps.id, None, timeout=1) == ps


def test_wrong_operator_key_is_refused(operator, stranger) -> None:
    swarm = MemorySwarm()
    ps = _prompt_set()
    seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, ps, "tiny", stranger)
    with pytest.raises(PromptSetError, match="wrong_owner"):
        load_prompt_set(MemoryTransport(swarm, "node"), SWARM, ps.id, operator.public_key, timeout=1)


def test_missing_set_is_a_clear_error(operator) -> None:
    with pytest.raises(PromptSetError, match="not found"):
        load_prompt_set(MemoryTransport(MemorySwarm(), "n"), SWARM, "arithmetic-00", operator.public_key, timeout=1)


def test_tampered_manifest_chunk_and_content_are_detected(operator) -> None:
    swarm = MemorySwarm()
    ps = _prompt_set()
    seeder = MemoryTransport(swarm, "seeder")
    manifest = seed_prompt_set(seeder, SWARM, ps, "tiny", operator)
    key = keys.prompt_manifest_key(SWARM, ps.id)
    exp = swarm.clock() + 100

    # 1. A changed manifest field breaks the signature.
    swarm.write_raw_owned(key, "seeder", codec.encode(dataclasses.replace(manifest, name="evil")), exp)
    with pytest.raises(PromptSetError, match="bad_signature"):
        load_prompt_set(MemoryTransport(swarm, "n"), SWARM, ps.id, operator.public_key, timeout=1)

    # 2. A swapped chunk fails its hash check.
    swarm.write_raw_owned(key, "seeder", codec.encode(manifest), exp)
    swarm.corrupt_blob(manifest.chunk_digests[0])
    with pytest.raises(PromptSetError, match="chunk_hash_mismatch"):
        load_prompt_set(MemoryTransport(swarm, "n"), SWARM, ps.id, operator.public_key, timeout=1)

    # 3. Validly signed, intact chunks, but problems that do not hash to the id.
    other = _prompt_set(salt=" (changed)")
    forged = seed_prompt_set(seeder, SWARM, dataclasses.replace(other, id=ps.id), "tiny", operator)
    assert forged.prompt_set_id == ps.id
    with pytest.raises(PromptSetError, match="content_mismatch"):
        load_prompt_set(MemoryTransport(swarm, "n"), SWARM, ps.id, operator.public_key, timeout=1)


def test_a_good_copy_wins_over_a_bad_one(operator) -> None:
    swarm = MemorySwarm()
    ps = _prompt_set()
    seed_prompt_set(MemoryTransport(swarm, "good"), SWARM, ps, "tiny", operator)
    swarm.write_raw_owned(keys.prompt_manifest_key(SWARM, ps.id), "junk", b"garbage", swarm.clock() + 500)
    assert load_prompt_set(MemoryTransport(swarm, "n"), SWARM, ps.id, operator.public_key, timeout=1) == ps


def test_an_ended_set_is_refused_with_a_one_line_error(operator, stranger) -> None:
    from swarm_node.util.errors import InputError, RuntimeFailure, describe
    from swarm_node.swarm.prompts import PromptSetEnded, end_prompt_set

    swarm = MemorySwarm()
    ps = _prompt_set()
    seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, ps, "tiny", operator)
    # A stranger's tombstone ends nothing (with or without a configured operator key).
    end_prompt_set(MemoryTransport(swarm, "mallory"), SWARM, ps.id, stranger)
    assert load_prompt_set(MemoryTransport(swarm, "n"), SWARM, ps.id, operator.public_key, timeout=1) == ps
    assert load_prompt_set(MemoryTransport(swarm, "n"), SWARM, ps.id, None, timeout=1) == ps
    end_prompt_set(MemoryTransport(swarm, "op"), SWARM, ps.id, operator, successor="arithmetic-v2")
    for owner in (operator.public_key, None):
        with pytest.raises(PromptSetEnded, match="use its successor") as info:
            load_prompt_set(MemoryTransport(swarm, "n"), SWARM, ps.id, owner, timeout=1)
    err = describe(info.value)
    assert isinstance(err, InputError) and "swarm.prompt_set_id=arithmetic-v2" in err.line()
    with pytest.raises(PromptSetError) as missing:
        load_prompt_set(MemoryTransport(swarm, "n"), SWARM, "arithmetic-00", None, timeout=1)
    assert isinstance(describe(missing.value), RuntimeFailure)
