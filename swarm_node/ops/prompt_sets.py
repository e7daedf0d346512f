"""`swarm-node seed` and `swarm-node end-prompt-set`: an operator's signed prompt sets in the swarm
(`swarm_node.swarm.prompts`), stored and kept alive, or ended with a tombstone."""

from __future__ import annotations

from pathlib import Path

from swarm_node.config import SwarmConfig, TaskConfig
from swarm_node.node.assemble import start_transport, usable_maddrs


def seed_task(task: str, source: str | None, task_seed: int = 0) -> TaskConfig:
    """The task a seeded set is built from; `task_seed`: the arithmetic task's procedural seed (another
    seed, another set of the same size and levels)."""
    from swarm_node.util.errors import InputError

    if task_seed and task != "arithmetic":
        raise InputError(f"--task-seed {task_seed} applies to the arithmetic task only ({task} loads a dataset)",
                         "leave --task-seed out, or pick the problems with --source")
    return TaskConfig(name=task, source=source, seed=task_seed)


def run_seed(*, task: str, source: str | None, name: str | None, swarm_id: str, key_file: Path,
             initial_peers: list[str], node_dir: Path, hold: float, task_seed: int = 0) -> None:
    import time

    from swarm_node.swarm.identity import load_or_create_key, public_key_text
    from swarm_node.swarm.prompts import seed_prompt_set
    from swarm_node.tasks import load_prompt_set

    prompt_set = load_prompt_set(seed_task(task, source, task_seed))
    operator = load_or_create_key(key_file)
    swarm_cfg = SwarmConfig(swarm_id=swarm_id, initial_peers=initial_peers)
    transport = start_transport(swarm_cfg, node_dir)
    try:
        default_name = f"{task}:{source or 'builtin'}" + (f":seed{task_seed}" if task_seed else "")
        manifest = seed_prompt_set(transport, swarm_id, prompt_set, name or default_name,
                                   operator, ttl_s=swarm_cfg.record_ttl_s)
        print(f"prompt set id:     {manifest.prompt_set_id}")
        print(f"problems:          {manifest.num_problems}")
        print(f"operator key:      {public_key_text(operator)}")
        for m in usable_maddrs(transport):
            print(f"seeder listening:  {m}")
        print("nodes join with: --set swarm.prompt_set_id=... --set swarm.prompt_set_owner=<operator key>")
        deadline = time.monotonic() + hold if hold > 0 else float("inf")
        while time.monotonic() < deadline:
            time.sleep(min(swarm_cfg.record_ttl_s / 3, max(0.0, deadline - time.monotonic())))
            if time.monotonic() < deadline:
                ended = keep_seeding(transport, swarm_id, prompt_set, manifest, operator, swarm_cfg.record_ttl_s)
                if ended is not None:
                    print(f"prompt set {manifest.prompt_set_id} was ended by its operator (end-prompt-set"
                          f"{', successor ' + ended.successor if ended.successor else ''}): the seeder stops", flush=True)
                    break
    except KeyboardInterrupt:
        pass
    finally:
        transport.shutdown()


def keep_seeding(transport, swarm_id: str, prompt_set, manifest, operator, ttl_s: float):
    """Re-seed the set unless its operator has ended it since `manifest` (the seeder's first) was
    made: then return the tombstone and store nothing. Found by the soak: a re-seed after
    `end-prompt-set` is a newer manifest, which the tombstone does not end, so the seeder brought
    the set back and every node that restarted later loaded the ended set again."""
    from swarm_node.swarm.prompts import ended_since, seed_prompt_set

    ended = ended_since(transport, swarm_id, manifest.prompt_set_id, operator.public_key, manifest.created_at)
    if ended is None:
        seed_prompt_set(transport, swarm_id, prompt_set, manifest.name, operator, ttl_s=ttl_s)
    return ended


def run_end_prompt_set(*, prompt_set_id: str, successor: str | None, swarm_id: str, key_file: Path,
                       initial_peers: list[str], node_dir: Path, ttl_s: float | None) -> None:
    """Store the operator's signed tombstone of a prompt set: nodes stop re-storing it; nodes with the
    operator key configured follow `successor`, the others refuse to load the set."""
    from protocol import keys
    from protocol.messages import ProtocolError
    from swarm_node.util.errors import InputError
    from swarm_node.swarm.identity import load_or_create_key, public_key_text
    from swarm_node.swarm.prompts import end_prompt_set

    try:
        for name in (prompt_set_id, *([successor] if successor else [])):
            keys.check_name(name, "prompt set id")
    except ProtocolError as e:
        raise InputError(str(e), "pass the id `swarm-node seed` printed") from e
    if not key_file.exists():
        raise InputError(f"operator key {key_file} not found",
                         "pass the --key-file the set was seeded with (only its key can end the set)")
    operator = load_or_create_key(key_file)
    swarm_cfg = SwarmConfig(swarm_id=swarm_id, initial_peers=initial_peers)
    transport = start_transport(swarm_cfg, node_dir)
    try:
        tombstone = end_prompt_set(transport, swarm_id, prompt_set_id, operator, successor=successor or "",
                                   ttl_s=ttl_s or swarm_cfg.max_record_ttl_s, timeout=swarm_cfg.fetch_timeout_s)
    finally:
        transport.shutdown()
    print(f"ended prompt set:  {tombstone.prompt_set_id}")
    print(f"operator key:      {public_key_text(operator)}")
    if tombstone.successor:
        print(f"successor:         {tombstone.successor}")
    print("nodes stop re-storing it at their next check; its records lapse within swarm.record_ttl_s after that")
    if tombstone.successor:
        print("nodes with swarm.prompt_set_owner set switch to the successor between two steps, and start on it")
