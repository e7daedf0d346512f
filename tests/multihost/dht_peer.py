"""A bare DHT peer for the multi-host test's relay check, run inside a host's namespace.

    python tests/multihost/dht_peer.py --peer MADDR [--auto-relay] [--seconds N]

Prints one JSON line a second (`peer_id`, `maddrs`: the usable addresses, `live_peers`) until
`--seconds` pass; if the DHT cannot join through `--peer`, prints {"error": ...} and exits 1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from swarm_node.swarm.dht import HivemindTransport, SwarmConnectError
from swarm_node.swarm.identity import load_node_identity


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", action="append", default=[])
    ap.add_argument("--auto-relay", action="store_true")
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="dht-peer-")
    try:
        t = HivemindTransport(load_node_identity(Path(scratch)), "multihost", initial_peers=args.peer,
                              use_auto_relay=args.auto_relay, startup_timeout=20, start_attempts=1)
    except SwarmConnectError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    end = time.monotonic() + args.seconds
    try:
        while True:
            health = t.read_health()
            print(json.dumps({"peer_id": t.peer_id, "maddrs": t.usable_maddrs,
                              "live_peers": health.live_peers if health else None}), flush=True)
            if time.monotonic() >= end:
                return 0
            time.sleep(1.0)
    finally:
        t.shutdown()


if __name__ == "__main__":
    sys.exit(main())
