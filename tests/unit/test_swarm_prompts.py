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


def _chain(swarm, operator, n: int, ends: list[tuple[int, int | None]]) -> list[PromptSet]:
    """`n` seeded sets; `ends`: (ended set, its successor or None), each signed by the operator."""
    from swarm_node.swarm.prompts import end_prompt_set

    sets = [_prompt_set(salt=f" (set {i})") for i in range(n)]
    for ps in sets:
        seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, ps, "tiny", operator)
    for ended, successor in ends:
        end_prompt_set(MemoryTransport(swarm, "op"), SWARM, sets[ended].id, operator,
                       successor=sets[successor].id if successor is not None else "")
    return sets


def test_an_ended_set_is_followed_to_the_end_of_its_successors(operator) -> None:
    from swarm_node.swarm.prompts import load_followed

    swarm = MemorySwarm()
    a, b, c = _chain(swarm, operator, 3, [(0, 1), (1, 2)])
    followed = load_followed(MemoryTransport(swarm, "n"), SWARM, a.id, operator.public_key, timeout=1)
    assert followed.prompt_set == c and followed.ended == (a.id, b.id)
    assert followed.message() == (f"prompt set {a.id} was ended by its operator: following its successor {c.id} "
                                  f"({a.id} -> {b.id} -> {c.id})")
    live = load_followed(MemoryTransport(swarm, "n"), SWARM, c.id, operator.public_key, timeout=1)
    assert live.prompt_set == c and live.ended == () and live.message() == ""


def test_only_the_operator_key_redirects_a_node(operator, stranger) -> None:
    from swarm_node.swarm.prompts import PromptSetEnded, end_prompt_set, load_followed

    swarm = MemorySwarm()
    a, b = _chain(swarm, operator, 2, [])
    # A stranger's tombstone naming a successor is not followed: the set is still live for its operator.
    end_prompt_set(MemoryTransport(swarm, "mallory"), SWARM, a.id, stranger, successor=b.id)
    followed = load_followed(MemoryTransport(swarm, "n"), SWARM, a.id, operator.public_key, timeout=1)
    assert followed.prompt_set == a and followed.ended == ()
    # The operator's is followed, but only with the operator key configured: without it, any key could
    # sign a copy of a public set and end it, so the end is today's error.
    end_prompt_set(MemoryTransport(swarm, "op"), SWARM, a.id, operator, successor=b.id)
    assert load_followed(MemoryTransport(swarm, "n"), SWARM, a.id, operator.public_key, timeout=1).prompt_set == b
    with pytest.raises(PromptSetEnded, match=f"use its successor \\(--set swarm.prompt_set_id={b.id}\\)"):
        load_followed(MemoryTransport(swarm, "n"), SWARM, a.id, None, timeout=1)


def test_an_end_without_successor_a_loop_or_a_long_chain_is_a_clear_error(operator) -> None:
    from swarm_node.swarm.prompts import PromptSetEnded, end_prompt_set, load_followed
    from swarm_node.util.errors import InputError, describe

    swarm = MemorySwarm()
    sets = _chain(swarm, operator, 12, [(0, None), (1, 2), (2, None), (3, 4), (4, 3)]
                  + [(i, i + 1) for i in range(5, 11)])
    owner = operator.public_key
    with pytest.raises(PromptSetEnded, match="ask the operator which prompt set to use") as info:
        load_followed(MemoryTransport(swarm, "n"), SWARM, sets[0].id, owner, timeout=1)
    assert str(info.value) == (f"prompt set {sets[0].id} was ended by its operator: "
                               "ask the operator which prompt set to use")  # as before successors were followed
    assert isinstance(describe(info.value), InputError)
    with pytest.raises(PromptSetEnded, match=f"ask the operator .* \\(followed from {sets[1].id}\\)"):
        load_followed(MemoryTransport(swarm, "n"), SWARM, sets[1].id, owner, timeout=1)
    with pytest.raises(PromptSetEnded, match=f"successors loop \\({sets[3].id} -> {sets[4].id} -> {sets[3].id}\\)"):
        load_followed(MemoryTransport(swarm, "n"), SWARM, sets[3].id, owner, timeout=1)
    # 5 -> 6 -> ... -> 11: six ends in a row are followed, more than max_hops are not.
    assert load_followed(MemoryTransport(swarm, "n"), SWARM, sets[5].id, owner, timeout=1).prompt_set == sets[11]
    with pytest.raises(PromptSetEnded, match="ended more than 5 times in a row"):
        load_followed(MemoryTransport(swarm, "n"), SWARM, sets[5].id, owner, timeout=1, max_hops=5)
    # A successor not (yet) seeded: the error says which ended set named it.
    end_prompt_set(MemoryTransport(swarm, "op"), SWARM, sets[11].id, operator, successor="arithmetic-0123")
    with pytest.raises(PromptSetError, match=f"arithmetic-0123 not found .* \\(the successor of ended prompt set "
                                             f"{sets[5].id} -> .* -> {sets[11].id}\\)") as missing:
        load_followed(MemoryTransport(swarm, "n"), SWARM, sets[5].id, owner, timeout=1)
    assert not isinstance(missing.value, PromptSetEnded)
    assert prompts.MAX_SUCCESSOR_HOPS == 8


def test_seed_takes_the_arithmetic_task_seed(operator, tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from swarm_node.ops.cli import app
    from swarm_node.config import TaskConfig
    from swarm_node.ops import prompt_sets as ops
    from swarm_node.tasks import load_prompt_set as load_task

    swarm = MemorySwarm()
    monkeypatch.setattr(ops, "start_transport", lambda swarm_cfg, node_dir: MemoryTransport(swarm, "seeder"))
    key = tmp_path / "operator.key"
    ids = []
    for extra in ([], ["--task-seed", "1"]):
        result = CliRunner().invoke(app, ["seed", "--task", "arithmetic", "--swarm-id", SWARM, "--key-file", str(key),
                                          "--hold", "0.01", *extra])
        assert result.exit_code == 0, result.output
        ids.append(next(line.split()[-1] for line in result.output.splitlines() if line.startswith("prompt set id:")))
    assert ids[0] != ids[1]  # another seed, another set
    owner = load_or_create_key(key).public_key
    assert load_prompt_set(MemoryTransport(swarm, "n"), SWARM, ids[1], owner, timeout=1) == \
        load_task(TaskConfig(name="arithmetic", seed=1))
    result = CliRunner().invoke(app, ["seed", "--task", "gsm8k", "--task-seed", "1", "--key-file", str(key)])
    assert result.exit_code != 0 and "--task-seed 1 applies to the arithmetic task only" in str(result.exception)
