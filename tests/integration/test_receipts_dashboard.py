"""The dashboard's peer-ledger table in a real headless Chromium shows, beside what a local node took
from each peer, what that peer's receipt says it took of the node's groups."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest

from protocol.messages import NodeStatus, Receipt
from tests.integration.test_dashboard_browser import (
    CHROMIUM_FLAGS,
    artifacts_dir,
    chromium_paths,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
OWN, ONE, TWO = "12D3KooWLocalNode", "12D3KooWLedgerPeerOne", "12D3KooWReceiverOnly"


def _ledger_cells(url: str, peers: list[str], timeout_s: float = 60.0) -> tuple[list[str], dict[str, list[str]]]:
    """(column headers, {peer: its row's cell texts}) of the peer-ledger table once it lists `peers`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = chromium_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    profile = tempfile.mkdtemp(prefix="swarm-node-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    try:
        drv.get(url)
        deadline = time.monotonic() + timeout_s
        while True:
            rows = drv.execute_script("""return Object.fromEntries([...document.querySelectorAll(
                '#ledger-nodes tbody tr')].map(r => [r.dataset.peer, [...r.cells].map(c => c.textContent)]));""")
            if sorted(rows) == sorted(peers) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        heads = drv.execute_script("return [...document.querySelectorAll('#ledger-nodes thead th')].map(t => t.textContent);")
        drv.save_screenshot(str(artifacts_dir() / "dashboard_receipts.png"))
        return heads, rows
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(chromium_paths() is None,
                    reason="needs Debian chromium + chromium-driver (apt-get install -y chromium chromium-driver)")
def test_the_ledger_table_shows_what_each_peer_took_of_ours(tmp_path):
    pytest.importorskip("selenium", reason="needs selenium (pip install selenium)")
    from swarm_node.observe.dashboard import (
        DashboardServer,
        LedgerSource,
        SyntheticStatusSource,
    )
    from swarm_node.peers.ledger import FILE_NAME, PeerLedger
    from swarm_node.policy.types import SampleStat

    ledger = PeerLedger(tmp_path / "node" / FILE_NAME, own_peer=OWN)
    ledger.record_group(ONE, None)
    ledger.record_samples([SampleStat(ONE, 1.0, 0.2, 1.0, False, True)] * 4)

    def receipt(taken: int, samples: int, gradient: int, dropped=()) -> Receipt:
        return Receipt(sender=OWN, taken=taken, samples=samples, gradient=gradient, filtered=0,
                       filtered_advantage=0, filtered_kl=0, dropped=dropped)

    ledger.note_receipts([
        NodeStatus(peer_id=ONE, role="trainer", model_id="m", step=5, timestamp=time.time(), receipts_span_s=600.0,
                   receipts=(receipt(3, 12, 7, (("stale", 2),)),)),
        NodeStatus(peer_id=TWO, role="trainer", model_id="m", step=5, timestamp=time.time(), receipts_span_s=600.0,
                   receipts=(receipt(0, 0, 0, (("tokenizer_mismatch", 4),)),)),
    ])
    ledger.save()
    with DashboardServer(SyntheticStatusSource(n_peers=1, seed=3), host="127.0.0.1", port=0, poll_interval_s=0.2,
                         ledger_source=LedgerSource([tmp_path / "node"])) as dash:
        heads, rows = _ledger_cells(dash.url + "?poll_ms=500", [ONE, TWO])
        dash.check()
    assert sorted(rows) == [ONE, TWO], rows
    took, grad, dropped = (heads.index(h) for h in ("it took ours", "our samples w/ grad there", "it dropped ours"))
    assert heads.index("taken / offered") < took  # beside what this node took of it
    assert (rows[ONE][1], rows[ONE][took], rows[ONE][grad], rows[ONE][dropped]) == ("1 / 1", "3", "7 / 12", "2 (stale)")
    assert (rows[TWO][1], rows[TWO][took], rows[TWO][dropped]) == ("0 / 0", "0", "4 (tokenizer_mismatch)")
