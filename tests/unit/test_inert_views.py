"""Every view prints a peer's strings inert (`util.inert`): `status`, `status --given` and
`status --peers` (through the CLI), the dashboard's API, the report, Prometheus, the log and a
command's error line. A hostile string holds a screen-clearing escape sequence, a bidirectional
override, rich markup and a newline; no view lets any of them act."""

from __future__ import annotations

import io
import json
import logging
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from protocol import codec, keys
from protocol.messages import NodeStatus, Receipt
from swarm_node.observe.dashboard import DashboardServer, FakeStatusSource, LedgerSource, Status
from swarm_node.observe.prometheus import PrometheusExporter
from swarm_node.observe.report import console_lines, read_summary, write_report
from swarm_node.ops.cli.common import InertFormatter, run_cli
from swarm_node.peers.ledger import FILE_NAME, PeerLedger
from swarm_node.policy.types import SampleStat
from swarm_node.swarm.exchange import RolloutExchange
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.util.errors import RuntimeFailure
from swarm_node.util.inert import inert
from tests import cli_run
from tests.cli_run import run

EVIL = "\x1b[2J\x1b[Hpwned\u202etxt.exe\nforged line"
MARKUP = "[red]LOUD"  # rich markup: read as markup, the brackets would vanish
ACTIVE = ("\x1b", "\u202e", "\nforged")  # what must never reach the output raw
PEER = "12D3KooWQwertyPeerAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
RECEIVER = "12D3KooWReceiverBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
LOUD = "12D3KooWLoudCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC"
BOOT = "/ip4/127.0.0.1/tcp/1/p2p/QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN"  # never dialled here


_restore_signals = cli_run._restore_signals  # the autouse fixture: a command installs signal handlers


def assert_inert(text: str) -> None:
    for raw in ACTIVE:
        assert raw not in text, (raw, text[:400])


def test_inert_escapes_what_acts_and_keeps_what_reads() -> None:
    assert inert(EVIL) == "\\x1b[2J\\x1b[Hpwned\\u202etxt.exe\\nforged line"
    assert inert("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
    assert inert("modèle ΩΣ 数学 🙂") == "modèle ΩΣ 数学 🙂"  # printable text of any script stays
    assert inert("a\u00a0b\u200bc\x7f\x9b\U000e0001") == "a\\xa0b\\u200bc\\x7f\\x9b\\U000e0001"
    assert inert(EVIL, max_chars=6) == "\\x1b[2" and inert(42) == "42"


def _swarm_with_evil_receiver() -> MemorySwarm:
    """A swarm whose one status record (RECEIVER's) names EVIL as its model and holds a receipt for PEER."""
    swarm = MemorySwarm()
    writer = MemoryTransport(swarm, peer_id=RECEIVER)
    st = NodeStatus(peer_id=RECEIVER, role="trainer", model_id=EVIL, step=3, timestamp=writer.dht_time(),
                    maddrs=(EVIL,), metrics={"reward_mean": 0.5, EVIL[:60]: 1.0}, tokenizer_fingerprint=EVIL,
                    receipts_span_s=60.0,
                    receipts=(Receipt(sender=PEER, taken=2, samples=8, gradient=3, filtered=1, filtered_advantage=1,
                                      filtered_kl=0, dropped=(("stale", 1),)),))
    shard_key = keys.status_key("s", keys.status_shard(writer.peer_id))
    assert writer.store_owned(shard_key, codec.encode(st), writer.dht_time() + 60)
    loud = MemoryTransport(swarm, peer_id=LOUD)
    st = NodeStatus(peer_id=LOUD, role="trainer", model_id=MARKUP, step=1, timestamp=loud.dht_time())
    shard_key = keys.status_key("s", keys.status_shard(loud.peer_id))
    assert loud.store_owned(shard_key, codec.encode(st), loud.dht_time() + 60)
    return swarm


@pytest.fixture()
def evil_swarm(monkeypatch) -> MemorySwarm:
    """`status` and `status --given` read the in-memory swarm instead of joining a DHT."""
    from swarm_node.observe import observer

    swarm = _swarm_with_evil_receiver()

    def connect(initial_peers, swarm_id, timeout):
        reader = MemoryTransport(swarm, peer_id="QmObserver")
        return reader, RolloutExchange(reader, swarm_id, vocab_size=1)

    monkeypatch.setattr(observer, "connect_light_observer", connect)
    monkeypatch.setenv("COLUMNS", "250")  # wide enough that rich cuts no cell short
    return swarm


def test_status_prints_a_peers_model_id_inert(capsys, evil_swarm) -> None:
    from swarm_node.observe.observer import run_status

    run_status([BOOT], "s", as_json=False, watch=False, interval=1.0, timeout=1.0)  # what `swarm-node status` runs
    out = capsys.readouterr().out
    assert_inert(out)
    assert "\\x1b[2J" in "".join(out.split()) and MARKUP in out  # shown as text: neither run nor read as markup


def test_status_given_prints_a_peers_model_id_inert(capsys, evil_swarm) -> None:
    """What `swarm-node status --given PEER` runs (the command itself, in a process of its own over a
    real DHT: tests/integration/test_status_sybils.py)."""
    from swarm_node.observe.given_view import run_given_status

    run_given_status([BOOT], "s", PEER, as_json=False, timeout=1.0)
    out = capsys.readouterr().out
    assert_inert(out)
    assert RECEIVER[:14] in out and "\\x1b[2J" in "".join(out.split()) and "identities are free" in " ".join(out.split())
    run_given_status([BOOT], "s", PEER, as_json=True, timeout=1.0)
    out = capsys.readouterr().out
    assert "\x1b" not in out  # JSON escapes it (\u001b) and keeps the exact string
    assert json.loads(out)["receivers"][0]["model_id"] == EVIL


def _evil_ledger(node_dir: Path) -> Path:
    ledger = PeerLedger(node_dir / FILE_NAME, own_peer=PEER)
    ledger.record_group(RECEIVER, None, tokenizer=EVIL)
    ledger.record_samples([SampleStat(RECEIVER, 1.0, 0.1, 1.0, False, True)])
    reader = MemoryTransport(_swarm_with_evil_receiver(), peer_id=PEER)
    ledger.note_receipts(RolloutExchange(reader, "s", vocab_size=1).read_statuses(timeout=1.0))
    ledger.save()
    return node_dir


def test_status_peers_prints_a_peers_tokenizer_inert(capsys, tmp_path) -> None:
    code, out, err = run(capsys, "status", "--peers", "--node-dir", str(_evil_ledger(tmp_path / "node")))
    assert code == 0, err
    assert_inert(out)
    assert RECEIVER[:14] in out and "\\x1b[2J" in out


def test_the_dashboard_serves_peer_strings_inert(tmp_path) -> None:
    src = FakeStatusSource([Status(peer_id=RECEIVER, model_id=EVIL, step=1, timestamp=1.0,
                                   metrics={EVIL: 1.0, "reward_mean": 0.5}, tokenizer_fingerprint=EVIL)])
    ledgers = LedgerSource([_evil_ledger(tmp_path / "node")])
    with DashboardServer(src, port=0, poll_interval_s=60, ledger_source=ledgers) as dash:
        dash.poll_once()
        for api in ("api/peers", "api/history", "api/ledger"):
            with urllib.request.urlopen(dash.url + api, timeout=5) as r:
                served = json.loads(r.read())
            assert_inert(json.dumps(served, ensure_ascii=False))  # the decoded strings, not JSON's escapes
        (peer,) = json.loads(urllib.request.urlopen(dash.url + "api/peers", timeout=5).read())["peers"]
        assert peer["model_id"] == inert(EVIL) and inert(EVIL) in peer["metrics"]


def test_the_report_writes_peer_strings_inert(tmp_path) -> None:
    node = tmp_path / "run" / "node-0"
    node.mkdir(parents=True)
    rows = [{"step": s, "reward_mean": 0.5, "own_samples": 8, "peer_samples_used": 4, "dropped_stale": 1,
             "dropped_" + EVIL: 2} for s in (1, 2)]
    (node / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = write_report(tmp_path / "run").read_text(encoding="utf-8")
    assert "\x1b" not in summary and "\u202e" not in summary and "\\x1b[2J" in summary
    assert not any(line.startswith("forged") for line in summary.splitlines())  # no line of the reason's making
    lines = console_lines(read_summary(tmp_path / "run" / "report"))
    assert len(lines) == 1 and all("\x1b" not in ln and "\n" not in ln for ln in lines)


def test_prometheus_labels_name_a_peers_tokenizer_inert() -> None:
    ledger = PeerLedger(None, own_tokenizer="ours")
    ledger.record_group(RECEIVER, None, tokenizer=EVIL)
    ledger.record_samples([SampleStat(RECEIVER, 1.0, 0.1, 1.0, False, True)])
    exporter = PrometheusExporter("127.0.0.1:0")  # never started: the registry is read directly
    exporter.update_peers(ledger.rows(), 5)
    text = generate_latest(exporter.registry).decode()
    assert_inert(text) and "ledger_peer_tokenizer{" in text and "\\\\x1b" in text


def test_log_lines_and_error_lines_are_inert(capsys) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(InertFormatter("%(levelname)s %(message)s"))
    log = logging.getLogger("test_inert_views")
    log.addHandler(handler)
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            log.error("peer %s sent a bad record", EVIL, exc_info=True)
    finally:
        log.removeHandler(handler)
    first, *traceback = out.getvalue().splitlines()
    assert_inert(first) and first.startswith("ERROR peer \\x1b[2J") and "forged line sent" in first
    assert traceback[0].startswith("Traceback") and traceback[-1] == "ValueError: boom"  # kept whole

    def fail(argv):
        raise RuntimeFailure(f"the peer said {EVIL}", "nothing to fix")

    with pytest.raises(SystemExit):
        run_cli(fail, [])
    err = capsys.readouterr().err
    assert_inert(err.rstrip("\n")) and err.count("\n") == 1 and "\\x1b[2J" in err
