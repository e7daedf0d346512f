"""`swarm-node doctor`: each failure it names is detected and comes with its fix line."""

from __future__ import annotations

import json
import socket

import pytest

from protocol.messages import NodeStatus
from swarm_node.ops import doctor
from swarm_node.ops.doctor import checks as dc
from swarm_node.ops.doctor import swarm as ds
from swarm_node.config import NodeConfig
from swarm_node.swarm.exchange import RolloutExchange
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from tests.cli_run import _restore_signals, run  # noqa: F401 (an autouse fixture)

PEER_ID = "QmWBQABuk97WzFaMq9kNsBoeQv5bGiVGieMtsphxDi6cap"


def _cfg(tmp_path, *overrides: str) -> NodeConfig:
    return NodeConfig.load(None, [f'node_dir="{tmp_path / "node"}"', 'model.name="tiny-random:64x1"', *overrides])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nobody listens there


def test_unreachable_initial_peer_fails_with_its_fix(tmp_path):
    port = _closed_port()
    cfg = _cfg(tmp_path, f'swarm.initial_peers=["/ip4/127.0.0.1/tcp/{port}/p2p/{PEER_ID}"]')
    r = ds.check_initial_peers(cfg, timeout=2.0)
    assert r.status == dc.FAIL
    assert f"127.0.0.1/tcp/{port}" in r.detail and "refused" in r.detail.lower()
    assert "no firewall blocks its TCP port" in r.fix


def test_reachable_initial_peer_reports_the_dial_time(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        r = ds.check_initial_peers(_cfg(tmp_path, f'swarm.initial_peers=["/ip4/127.0.0.1/tcp/{port}/p2p/{PEER_ID}"]'))
    assert r.status == dc.PASS and " ms)" in r.detail


def test_port_in_use_fails_with_its_fix(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = dc.check_ports(_cfg(tmp_path, f'swarm.host_maddrs=["/ip4/127.0.0.1/tcp/{port}"]'))
    assert r.status == dc.FAIL and str(port) in r.detail
    assert "stop the process using that port" in r.fix
    assert dc.check_ports(_cfg(tmp_path, f'swarm.host_maddrs=["/ip4/127.0.0.1/tcp/{port}"]')).status == dc.PASS


def test_missing_model_fails_with_its_fix(tmp_path):
    r = dc.check_model(_cfg(tmp_path, f'model.name="{tmp_path / "no-such-model"}"'))
    assert r.status == dc.FAIL and "no-such-model" in r.detail and r.fix
    empty = tmp_path / "empty-model"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    r = dc.check_model(_cfg(tmp_path, f'model.name="{empty}"'))
    assert r.status == dc.FAIL and "no *.safetensors" in r.detail and "holds the weights" in r.fix


def _probe_with_skew(tmp_path, offset: float) -> ds.SwarmProbe:
    swarm = MemorySwarm()
    peers = [MemoryTransport(swarm, f"peer{i}") for i in range(2)]
    for t in peers:
        RolloutExchange(t, "swarm-node-default", vocab_size=1).publish_status(NodeStatus(
            peer_id=t.peer_id, role="trainer", model_id="m", step=1, timestamp=t.dht_time(),
            maddrs=(f"/ip4/127.0.0.1/tcp/1/p2p/{t.peer_id}",)))
    probe = ds.SwarmProbe(_cfg(tmp_path), timeout=2.0)
    probe.transport = MemoryTransport(swarm, "me", clock_offset_s=offset)  # simulated skew of this node
    return probe


def test_skewed_clock_fails_with_its_fix(tmp_path):
    r = ds.check_clock(_probe_with_skew(tmp_path, 100.0))
    assert r.status == dc.FAIL and "100.0 s ahead of the swarm (median of 2 peers" in r.detail
    assert "60 s for the rollout windows" in r.detail and "timedatectl set-ntp true" in r.fix
    assert ds.check_clock(_probe_with_skew(tmp_path, -10.0)).status == dc.WARN
    assert ds.check_clock(_probe_with_skew(tmp_path, 0.0)).status == dc.PASS


def test_round_trip(tmp_path):
    probe = _probe_with_skew(tmp_path, 0.0)
    assert ds.check_round_trip(probe).status == dc.PASS


def test_memory_shows_the_plan_by_part_and_what_fits(tmp_path, monkeypatch):
    from swarm_node.node import memory_budget as mb

    gib = 1 << 30
    monkeypatch.setattr(mb, "machine_budget", lambda device: mb.Budget("cpu", 64 * gib, 64 * gib, "RAM"))
    cfg = _cfg(tmp_path, 'model.name="smollm2-135m"', 'generation.backend="hf"')
    r = dc.check_memory(cfg)
    assert r.status == dc.PASS and "micro-batch 8" in r.detail and "135M parameters" in r.detail
    names = [line.split()[0] for line in r.more]
    assert names[:4] == ["baseline", "weights", "optimizer", "gradients"] and names[-2:] == ["peak", "expected"]
    prompt = mb.longest_prompt_tokens(cfg, dc.preflight.check_task_data(cfg))
    total = mb.node_plan(cfg, mb.EMBEDDED_SHAPE, "cpu", prompt_tokens=prompt).total
    assert mb.gib(total) in r.detail and mb.gib(total) in r.more[-2]
    assert "worst case" in r.more[-1]  # no steps logged yet: nothing to expect from
    # after steps whose longest sequences were short, the plan at those lengths is shown beside the worst case
    (tmp_path / "node").mkdir()
    rows = [{"step": 1, "longest_prompt_tokens": prompt, "longest_completion_tokens": 40},
            {"step": 2, "longest_prompt_tokens": prompt - 3, "longest_completion_tokens": 64}, {"step": 3}]
    (tmp_path / "node" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"torn')
    seen = mb.observed_lengths(tmp_path / "node")
    assert (seen.prompt_tokens, seen.completion_tokens, seen.steps) == (prompt, 64, 2)
    r = dc.check_memory(cfg)
    expected = mb.node_plan(cfg, mb.EMBEDDED_SHAPE, "cpu", prompt_tokens=prompt, completion_tokens=64).total
    assert expected < 0.8 * total
    assert r.more[-1].split()[:2] == ["expected", mb.gib(expected).split()[0]] and "completion 64 tokens" in r.more[-1]
    assert "over 2 logged steps" in r.more[-1]
    (tmp_path / "node" / "metrics.jsonl").unlink()
    shown = doctor.render_line(doctor.run_checks([doctor.Check("memory", True, lambda: r)])[0])
    assert "\n       activations" in shown
    monkeypatch.setattr(mb, "machine_budget", lambda device: mb.Budget("cpu", 2 * gib, 2 * gib, "RAM"))
    r = dc.check_memory(cfg)
    assert r.status == dc.FAIL and "does not fit" in r.detail and "model.lora.enabled=true" in r.fix
    monkeypatch.setattr(mb, "machine_budget", lambda device: mb.Budget("cpu", 2 * gib, 64 * gib, "RAM"))
    assert dc.check_memory(cfg).status == dc.WARN  # fits the machine, not what is free now


def test_memory_on_a_qwen_shape_and_a_gpu_shows_the_margin_kept_free(tmp_path, monkeypatch):
    """Qwen2.5-1.5B from its config.json alone (no weights), vLLM at half of an 80 GB GPU (a simulated
    budget): the plan by part, the margin, and a micro-batch whose peak leaves the margin free."""
    from swarm_node.node import memory_budget as mb
    from tests.unit.test_memory_plan import GPU_80GB, QWEN_1_5B

    model = tmp_path / "qwen2.5-1.5b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN_1_5B))
    monkeypatch.setattr(mb, "machine_budget", lambda device: GPU_80GB)
    cfg = _cfg(tmp_path, f'model.name="{model}"', 'generation.backend="vllm"',
               "generation.vllm_gpu_memory_utilization=0.5", "train.micro_batch_size=0")
    r = dc.check_memory(cfg)
    assert r.status == dc.PASS and "1544M parameters" in r.detail, r
    assert "7.92 GiB of it kept free (10% of the GPU)" in r.detail
    names = [line.split()[0] for line in r.more]
    assert {"generator", "CUDA", "spot-check", "reserve"} <= set(names) and names[-3:] == ["peak", "margin", "expected"]
    micro_batch = int(r.detail.split("micro-batch ")[1].split()[0].rstrip(","))
    plan = mb.node_plan(cfg, mb.ModelShape.from_config(QWEN_1_5B), "cuda", micro_batch=micro_batch,
                        checkpointing="gradient checkpointing" in r.detail, gpu_total=GPU_80GB.total)
    assert GPU_80GB.available - plan.total >= GPU_80GB.margin  # the margin stays free at the peak
    assert mb.gib(GPU_80GB.available - plan.total) in r.more[names.index("margin")]


def test_exit_code_counts_required_failures_only():
    def fixed(status):
        return lambda: dc.Result(status, "x", "do y")

    advisory_fail = doctor.run_checks([doctor.Check("a", True, fixed(dc.PASS)), doctor.Check("b", False, fixed(dc.FAIL))])
    assert doctor.exit_code(advisory_fail) == 0
    required_fail = doctor.run_checks([doctor.Check("a", True, fixed(dc.FAIL))])
    assert doctor.exit_code(required_fail) == 1 and "do y" in doctor.render_line(required_fail[0])

    def crash():
        raise ValueError("boom")

    crashed = doctor.run_checks([doctor.Check("c", True, crash)])
    assert crashed[0].status == dc.FAIL and "boom" in crashed[0].detail


def test_cli_json_names_the_failed_check(capsys, tmp_path):
    code, out, _err = run(capsys, "doctor", "--no-swarm", "--json", "--node-dir", str(tmp_path / "n"),
                          "-s", f'model.name="{tmp_path / "missing"}"')
    result = json.loads(out)
    assert code == 1 and result["ok"] is False and result["exit_code"] == 1
    by_name = {c["check"]: c for c in result["checks"]}
    assert by_name["model"]["status"] == "fail" and by_name["model"]["required"] is True and by_name["model"]["fix"]
    assert by_name["python"]["status"] == "pass" and by_name["gpu"]["required"] is False


def test_nat_guess_from_routes():
    import struct

    def n(ip: str) -> int:
        return struct.unpack("<I", socket.inet_aton(ip))[0]

    routes = [(0, 0, n("192.168.1.1")), (n("192.168.1.0"), n("255.255.255.0"), 0)]  # home LAN + default route
    assert ds.nat_guess("192.168.1.5", "203.0.113.7", routes)[0] == "nat"
    assert ds.nat_guess("192.168.1.5", "192.168.1.9", routes)[0] == "lan"
    assert ds.nat_guess("93.184.216.34", "203.0.113.7", routes)[0] == "public"
    assert ds.nat_guess("10.0.0.2", "203.0.113.7", [])[0] == "unknown"
    assert ds.nat_guess("127.0.0.1", "127.0.0.1", routes)[0] == "lan"
    assert ds.read_routes("/nonexistent") == []


def test_routes_read_as_the_kernel_prints_them(tmp_path):
    table = tmp_path / "route"
    table.write_text("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
                     "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"  # default via 192.0.2.1
                     "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")  # 192.0.2.0/24 on link
    routes = ds.read_routes(str(table))
    assert ds.nat_guess("192.0.2.2", "192.0.2.77", routes)[0] == "lan"
    assert ds.nat_guess("192.0.2.2", "203.0.113.7", routes)[0] == "nat"
