"""A DHT peer for the relay check, run inside a namespace: prints its usable multiaddrs as JSON
lines every second until killed or `--seconds` pass, and whether its initial peers answered."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from swarm_node.swarm.dht import HivemindTransport, SwarmConnectError
from swarm_node.swarm.identity import load_node_identity


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", action="append", default=[])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--auto-relay", action="store_true")
    ap.add_argument("--seconds", type=float, default=120.0)
    args = ap.parse_args()
    try:
        t = HivemindTransport(load_node_identity(Path(tempfile.mkdtemp())), "relaycheck", initial_peers=args.peer,
                              host_maddrs=[f"/ip4/0.0.0.0/tcp/{args.port}"], use_auto_relay=args.auto_relay,
                              startup_timeout=30, start_attempts=1)
    except SwarmConnectError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 1
    end = time.monotonic() + args.seconds
    try:
        while time.monotonic() < end:
            health = t.read_health() or None
            print(json.dumps({"peer_id": t.peer_id, "maddrs": t.usable_maddrs,
                              "live_peers": health.live_peers if health else None}), flush=True)
            time.sleep(1.0)
    finally:
        t.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
