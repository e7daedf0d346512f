"""swarm-node: collaborative GRPO (F-TIS) across a peer-to-peer swarm of different models."""

import sys as _sys

__version__ = "0.1.0"

if _sys.argv[:1] == ["-m"] or _sys.argv[0].endswith("/swarm-node") or _sys.argv[0] == "swarm-node":
    # Imported as the program (`swarm-node ...` or `python -m swarm_node`): handle SIGINT and
    # SIGTERM from the first instant, before the slow imports of a command (see lifecycle.py).
    from swarm_node.util import lifecycle as _lifecycle

    _lifecycle.install_signal_handlers()
