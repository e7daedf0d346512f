"""Every failure a user can cause before a node trains ends in one line, an exit code (2 bad input,
1 runtime) and no lost state; each case is checked through the real `swarm-node` command, in
process (the cases that are about processes and signals are in tests/integration/test_run_for_real.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest

from tests.cli_run import _restore_signals, run  # noqa: F401 (an autouse fixture)

TINY = ["-s", "model.name=tiny-random:64x1:a", "-s", "generation.group_size=2", "-s", "generation.max_new_tokens=4",
        "-s", "train.prompts_per_step=1"]


def error_line(err: list[str]) -> str:
    """The one error line; log lines (timestamped INFO/WARNING) may precede it, nothing follows it."""
    errors = [ln for ln in err if ln.startswith("swarm-node: error:")]
    assert len(errors) == 1, err
    assert err[-1] == errors[0], err
    assert "Traceback" not in "\n".join(err)
    return errors[0]


def cache(tmp_path: Path) -> list[str]:
    return ["-s", f"model.cache_dir={json.dumps(str(tmp_path / 'cache'))}"]


def test_version_help_examples_and_defaults(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == "swarm-node 0.1.0"
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "Examples:" in out and "swarm-node local" in out
    code, out, _ = run(capsys, "train", "--help")
    assert code == 0 and "./node" in out and "100" in out and "Example:" in out
    code, out, _ = run(capsys, "local", "--help")
    assert code == 0 and "runs/local-<date>-<time>" in out


def test_usage_errors_are_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "join", "--bogus")
    assert code == 2 and "No such option: --bogus" in error_line(err)
    code, _, err = run(capsys, "local", "--config", str(tmp_path))
    assert code == 2 and "is a directory" in error_line(err)


def test_config_errors_name_the_field_and_file(capsys, tmp_path):
    code, _, err = run(capsys, "train", "-s", "train.total_steps=0", "--node-dir", str(tmp_path / "n"))
    assert code == 2 and "train.total_steps" in error_line(err) and "greater than or equal to 1" in err[-1]
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nx=1\n")
    code, _, err = run(capsys, "train", "-c", str(bad))
    assert code == 2 and str(bad) in error_line(err) and "TOML" in err[-1]
    code, _, err = run(capsys, "local", "-c", str(bad))
    assert code == 2 and str(bad) in error_line(err)
    code, _, err = run(capsys, "local", "-s", "train.nonsense=1", "--run-dir", str(tmp_path / "r"))
    assert code == 2 and "node full" in error_line(err) and "train.nonsense" in err[-1]
    assert not (tmp_path / "r").exists()  # nothing started


def test_local_nodes_option_beats_the_file(tmp_path):
    from swarm_node.ops.local import plan_nodes

    path = tmp_path / "l.toml"
    path.write_text('nodes = 2\n[[node]]\nname = "a"\nset = []\n[[node]]\nname = "b"\nset = []\n')
    assert [n["name"] for n in plan_nodes(1, path)[1]] == ["a"]
    assert [n["name"] for n in plan_nodes(None, path)[1]] == ["a", "b"]
    assert [n["name"] for n in plan_nodes(3, path)[1]] == ["a", "b", "node2"]


def test_model_that_is_not_a_model_fails_before_loading(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "train", *TINY, *cache(tmp_path), "-s", f"model.name={json.dumps(str(tmp_path / 'empty'))}",
                       "--node-dir", str(tmp_path / "n"))
    assert code == 2 and "without config.json" in error_line(err)
    code, _, err = run(capsys, "train", "-s", "model.name=not a model id!", "--node-dir", str(tmp_path / "n"))
    assert code == 2 and "neither a local directory nor a hub id" in error_line(err)


def test_unknown_hub_model_is_one_line_and_keeps_the_resolved_config(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the same failure as an unknown id, without waiting on DNS
    node = tmp_path / "n"
    node.mkdir()
    (node / "config.resolved.toml").write_text("# the last good start\n")
    code, _, err = run(capsys, "train", *TINY, "-s", "model.name=no-such-org/no-such-model", "--node-dir", str(node))
    assert code == 2 and "'no-such-org/no-such-model'" in error_line(err) and "Hugging Face hub" in err[-1]
    assert (node / "config.resolved.toml").read_text() == "# the last good start\n"


def test_bad_initial_peer_is_input_error(capsys, tmp_path):
    code, _, err = run(capsys, "join", *TINY, "-p", "/ip4/1.2.3.4/tcp/5", "--node-dir", str(tmp_path / "n"))
    assert code == 2 and "'/ip4/1.2.3.4/tcp/5'" in error_line(err) and "/p2p/" in err[-1]
    code, _, err = run(capsys, "status", "-p", "not-an-address", "--json")
    assert code == 2 and "not-an-address" in error_line(err)


def _busy_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def test_ports_in_use_are_named(capsys, tmp_path):
    sock, port = _busy_port()
    with sock:
        code, _, err = run(capsys, "join", *TINY, *cache(tmp_path), "--node-dir", str(tmp_path / "n"),
                           "-s", f'swarm.host_maddrs=["/ip4/127.0.0.1/tcp/{port}"]')
        assert code == 2 and f"/ip4/127.0.0.1/tcp/{port}" in error_line(err) and "in use" in err[-1]
        code, _, err = run(capsys, "train", *TINY, *cache(tmp_path), "--node-dir", str(tmp_path / "n"),
                           "-s", f'metrics.prometheus_addr="127.0.0.1:{port}"')
        assert code == 2 and f"127.0.0.1:{port}" in error_line(err)
    assert not (tmp_path / "cache").exists()  # failed before the model was built


def test_node_dir_problems(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    code, _, err = run(capsys, "train", *TINY, "--node-dir", str(afile))
    assert code == 2 and "is a file" in error_line(err)
    assert afile.read_text() == "keep me"
    node = tmp_path / "n"
    node.mkdir()
    (node / "checkpoints").write_text("")
    code, _, err = run(capsys, "train", *TINY, "--node-dir", str(node))
    assert code == 2 and "checkpoints is a file" in error_line(err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to any directory")
def test_node_dir_not_writable(capsys, tmp_path):
    node = tmp_path / "n"
    (node / "checkpoints").mkdir(parents=True)
    (node / "checkpoints").chmod(0o500)
    try:
        code, _, err = run(capsys, "train", *TINY, "--node-dir", str(node))
    finally:
        (node / "checkpoints").chmod(0o700)
    assert code == 2 and "not writable" in error_line(err)


def test_corrupt_identity_key_names_the_file_and_is_kept(capsys, tmp_path):
    node = tmp_path / "n"
    node.mkdir()
    key = node / "identity.key"
    key.write_bytes(b"not a key at all")
    key.chmod(0o600)
    code, _, err = run(capsys, "join", *TINY, *cache(tmp_path), "--node-dir", str(node))
    assert code == 2 and str(key) in error_line(err) and "move it away" in err[-1]
    assert key.read_bytes() == b"not a key at all"


def test_task_source_problems_fail_before_the_model(capsys, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"q": "1+1?", "a": "2"}) + "\n")
    args = ["train", *TINY, *cache(tmp_path), "--node-dir", str(tmp_path / "n"), "-s", "task.name=gsm8k"]
    code, _, err = run(capsys, *args, "-s", f"task.source={json.dumps(str(rows))}")
    assert code == 2 and "'question'" in error_line(err) and "row 1" in err[-1]
    code, _, err = run(capsys, *args, "-s", f"task.source={json.dumps(str(tmp_path / 'missing.jsonl'))}")
    assert code == 2 and "does not exist" in error_line(err)
    assert not (tmp_path / "cache").exists()


def test_report_without_metrics(capsys, tmp_path):
    code, _, err = run(capsys, "report", str(tmp_path))
    assert code == 2 and f"no metrics.jsonl under {tmp_path}" in error_line(err)


def test_eval_checkpoint_problems(capsys, tmp_path):
    code, _, err = run(capsys, "eval", "--checkpoint", str(tmp_path))
    assert code == 2 and "is not a checkpoint" in error_line(err)


def test_interrupt_before_the_work_starts_exits_130(capsys, tmp_path, monkeypatch):
    import swarm_node.node.assemble as assemble

    def interrupted(_cfg):
        os.kill(os.getpid(), signal.SIGINT)  # raised as lifecycle.Interrupted at once
        raise AssertionError("not reached")

    monkeypatch.setattr(assemble, "run_node", interrupted)
    code, _, err = run(capsys, "train", *TINY, "--node-dir", str(tmp_path / "n"))
    assert code == 130 and err[-1] == "swarm-node: stopped by SIGINT"


def test_status_against_an_unreachable_peer(capsys):
    peer = "/ip4/127.0.0.1/tcp/9/p2p/QmZGKCaWuyavctPW61FfXeT86Y4s5jMJ6j13J1BVRP6Rop"  # nothing listens on port 9
    code, out, err = run(capsys, "status", "-p", peer, "--timeout", "3", "--json")
    assert code == 1
    answer = json.loads(out)  # scripts still get JSON on stdout
    assert answer["exit_code"] == 1 and peer in answer["error"]
    assert "could not reach any initial peer" in error_line(err) and peer in err[-1]


def test_end_prompt_set_needs_the_operator_key_and_a_valid_id(capsys, tmp_path):
    code, out, _ = run(capsys, "end-prompt-set", "--help")
    assert code == 0 and "tombstone" in out and "Example:" in out
    code, _, err = run(capsys, "end-prompt-set", "arithmetic-0123", "--key-file", str(tmp_path / "missing.key"),
                       "--node-dir", str(tmp_path / "op"))
    assert code == 2 and "operator key" in error_line(err) and "missing.key" in error_line(err)
    code, _, err = run(capsys, "end-prompt-set", "no/slashes", "--key-file", str(tmp_path / "missing.key"))
    assert code == 2 and "bad prompt set id" in error_line(err)
    assert not (tmp_path / "op").exists()  # nothing started
