"""The one-shot `status` reads through hivemind's DHT without importing torch (swarm/light.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


def test_status_path_imports_no_torch_and_completes_on_demand():
    out = _python(
        "import sys\n"
        "from swarm_node.swarm.patches import load_light_hivemind\n"
        "from swarm_node.swarm.light import LightObserver\n"
        "assert load_light_hivemind()\n"
        "import hivemind.dht.node, hivemind.dht.validation, swarm_node.swarm.validators\n"
        "import swarm_node.swarm.exchange, swarm_node.observe.observer, swarm_node.node.preflight\n"
        "from swarm_node.swarm.addresses import check_initial_peers\n"
        "check_initial_peers(['/ip4/127.0.0.1/tcp/1/p2p/QmWBQABuk97WzFaMq9kNsBoeQv5bGiVGieMtsphxDi6cap'])\n"
        "print('torch' in sys.modules)\n"
        "node_class = hivemind.dht.node.DHTNode\n"
        "from hivemind import DHT\n"  # a name only the real package has: the import completes
        "print(DHT.__name__, hivemind.dht.DHTNode is node_class, 'torch' in sys.modules)\n")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "DHT", "True", "True"]


def test_status_against_no_swarm_is_one_line_without_torch():
    out = subprocess.run([sys.executable, "-m", "swarm_node", "status", "--timeout", "3", "-p",
                          "/ip4/127.0.0.1/tcp/1/p2p/QmWBQABuk97WzFaMq9kNsBoeQv5bGiVGieMtsphxDi6cap"],
                         capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                              "PYTHONPROFILEIMPORTTIME": "1"})
    assert out.returncode == 1
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("swarm-node: error:")]
    assert len(errors) == 1 and "could not reach any initial peer" in errors[0] and "reachable from here" in errors[0]
    assert not [ln for ln in out.stderr.splitlines() if ln.startswith("import time:") and ln.endswith(" torch")]
