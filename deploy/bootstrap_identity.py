"""Create (once) and print the libp2p identity of a bootstrap node.

    python deploy/bootstrap_identity.py PATH      # prints the peer id, e.g. 12D3KooW... or Qm...

The private key at PATH is what `hivemind-dht --identity_path PATH` loads, so the bootstrap
node's peer id, and with it its multiaddr `/ip4/<ip>/tcp/<port>/p2p/<peer id>`, stays the same
across restarts. An existing file is never overwritten. Keep it private and back it up: whoever
holds it can impersonate the bootstrap node.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def ensure_identity(path: Path) -> str:
    """Create the key at `path` if absent (mode 0400); return its peer id in base58."""
    from hivemind.p2p import P2P, PeerID

    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        P2P.generate_identity(os.fspath(path))
    return PeerID.from_identity(path.read_bytes()).to_base58()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="identity file (created when missing)")
    args = parser.parse_args(argv)
    print(ensure_identity(args.path))


if __name__ == "__main__":
    main()
