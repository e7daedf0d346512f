"""The commands of operators and observers: `seed`, `end-prompt-set` and `allow-list` (an operator's
signed records), `status` and `dashboard` (watching a swarm), `bootstrap` (a DHT-only entry peer).

Plain functions with typer annotations; `swarm_node.ops.cli` registers them (`COMMANDS`) on the one app,
so they run under the same `cli.common.run_cli` as every other command.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from swarm_node.ops.cli.common import (ConfigOpt, NodeDirOpt, PeerOpt, SetOpt, VerboseOpt, load_config, peer_overrides,
                                   setup_logging)
from swarm_node.config import NodeConfig
from swarm_node.util.errors import describe


def seed(task: Annotated[str, typer.Option(help="arithmetic, gsm8k or math500.")] = "gsm8k",
         source: Annotated[Optional[str], typer.Option(help="Hub dataset id or local .jsonl path.")] = None,
         task_seed: Annotated[int, typer.Option(min=0, help="Arithmetic: the procedural set's seed (task.seed); "
                                                "another seed seeds another set.")] = 0,
         name: Annotated[Optional[str], typer.Option(help="Human-readable name of the prompt set.")] = None,
         swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
         key_file: Annotated[Path, typer.Option(help="Operator signing key (created if missing, mode 0600).")] = Path("operator.key"),
         initial_peer: PeerOpt = None,
         node_dir: Annotated[Path, typer.Option(help="Directory for the seeder's DHT identity.")] = Path("./seeder"),
         hold: Annotated[float, typer.Option(help="Seconds to keep serving and republishing; 0 = until Ctrl-C.")] = 0.0) -> None:
    """Publish a prompt set as a signed manifest plus content-addressed chunks."""
    from swarm_node.ops.prompt_sets import run_seed

    setup_logging()
    run_seed(task=task, source=source, name=name, swarm_id=swarm_id, key_file=key_file,
             initial_peers=initial_peer or [], node_dir=node_dir, hold=hold, task_seed=task_seed)


def end_prompt_set(prompt_set_id: Annotated[str, typer.Argument(help="The id `swarm-node seed` printed.")],
                   successor: Annotated[Optional[str], typer.Option(help="Id of the set that replaces it (nodes "
                                                                              "with the operator key switch to it).")] = None,
                   swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
                   key_file: Annotated[Path, typer.Option(help="The operator key the set was seeded with.")] = Path("operator.key"),
                   initial_peer: PeerOpt = None,
                   node_dir: Annotated[Path, typer.Option(help="Directory for this command's DHT identity.")] = Path("./operator-node"),
                   ttl: Annotated[Optional[float], typer.Option(min=1.0, help="Seconds the tombstone lives (default: "
                                                                         "swarm.max_record_ttl_s, 3600).")] = None,
                   verbose: VerboseOpt = False) -> None:
    """End a seeded prompt set: store a tombstone signed by the operator key. Nodes stop re-storing the set
    (it lapses within one record TTL); nodes with its operator key (swarm.prompt_set_owner) move to the
    --successor, running or starting; others refuse to load it."""
    from swarm_node.ops.prompt_sets import run_end_prompt_set

    setup_logging(verbose)
    run_end_prompt_set(prompt_set_id=prompt_set_id, successor=successor, swarm_id=swarm_id, key_file=key_file,
                       initial_peers=initial_peer or [], node_dir=node_dir, ttl_s=ttl)


def allow_list(peer: Annotated[list[str], typer.Option("--peer", help="A peer id to allow (repeat the option).")],
               out: Annotated[Path, typer.Option(help="Where to write the signed allow-list.")] = Path("allow-list.json"),
               swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
               key_file: Annotated[Path, typer.Option(help="Operator signing key (the prompt-set key).")] = Path("operator.key")) -> None:
    """Sign an allow-list of peer ids for a closed swarm (nodes: swarm.allowed_peers_file)."""
    from swarm_node.swarm.allowlist import write_allow_list
    from swarm_node.swarm.identity import load_or_create_key

    peers = write_allow_list(out, swarm_id, peer, load_or_create_key(key_file))
    print(f"{out}: {len(peers)} peers of swarm {swarm_id!r}, signed by {key_file}")


def status(initial_peer: PeerOpt = None, swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
           as_json: Annotated[bool, typer.Option("--json", help="Print the records as JSON (an object with "
                                                 "`error` on failure).")] = False,
           watch: Annotated[bool, typer.Option(help="Refresh the table until Ctrl-C.")] = False,
           interval: Annotated[float, typer.Option(min=0.5)] = 5.0,
           timeout: Annotated[float, typer.Option(min=1.0, help="Seconds to wait for the swarm.")] = 20.0,
           peers: Annotated[bool, typer.Option("--peers", help="Show the peer ledger of a local node (--node-dir) "
                                               "instead: what it took from and dropped of each peer.")] = False,
           heldout: Annotated[bool, typer.Option("--heldout", help="Show the held-out trend of a local node "
                                                 "(--node-dir) instead: each evaluation with its 95% interval and "
                                                 "its change from the first.")] = False,
           given: Annotated[Optional[str], typer.Option("--given", metavar="NODE_DIR|PEER_ID", help="Show what a node's "
                                                        "groups gave the swarm instead: the receipts in peers' status "
                                                        "records naming it (taken, trained on, filtered, dropped "
                                                        "and why), per receiver.")] = None,
           node_dir: NodeDirOpt = None,
           verbose: VerboseOpt = False) -> None:
    """Table of live peers from their status records (--peers: a local node's peer ledger; --heldout:
    its held-out trend; --given: the receipts peers give a node's groups)."""
    from swarm_node.util.errors import InputError

    setup_logging(verbose)
    if not watch:  # one read: hivemind's DHT without torch (seconds less; see swarm/patches.py)
        from swarm_node.swarm.patches import load_light_hivemind

        load_light_hivemind()
    try:
        if peers:
            from swarm_node.observe.ledger_view import run_peers_status

            return run_peers_status(node_dir or NodeConfig().node_dir, as_json=as_json, watch=watch, interval=interval)
        if heldout:
            from swarm_node.observe.heldout_view import run_heldout_status

            return run_heldout_status(node_dir or NodeConfig().node_dir, as_json=as_json, watch=watch,
                                      interval=interval)
        if not initial_peer:
            raise InputError("status needs --initial-peer", "pass the multiaddr of any node of the swarm (-p ...)")
        from swarm_node.node import preflight
        from swarm_node.observe.observer import run_status

        preflight.check_initial_peers(initial_peer)
        if given is not None:
            from swarm_node.observe.given_view import run_given_status

            run_given_status(initial_peer, swarm_id, given, as_json=as_json, timeout=timeout)
        else:
            run_status(initial_peer, swarm_id, as_json=as_json, watch=watch, interval=interval, timeout=timeout)
    except Exception as e:
        typed = describe(e)
        if as_json:  # scripts parse stdout: JSON even on failure
            print(json.dumps({"error": typed.line() if typed else f"{type(e).__name__}: {e}",
                              "exit_code": typed.exit_code if typed else 1}), flush=True)
        raise
    # The client has shut down its DHT process; skip the interpreter's teardown of torch and
    # hivemind (seconds on a busy machine) so a one-shot `status` returns at once.
    from swarm_node.util import lifecycle

    sys.stdout.flush()
    sys.stderr.flush()
    signum = lifecycle.received_signal()
    os._exit(lifecycle.exit_code_for(signum) if signum else 0)


def dashboard(initial_peer: PeerOpt = None, swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
              host: Annotated[str, typer.Option()] = "127.0.0.1",
              port: Annotated[int, typer.Option(min=0, max=65535, help="0 picks a free port.")] = 8080,
              poll_interval: Annotated[float, typer.Option(min=0.2, help="Seconds between status reads.")] = 2.0,
              node_dir: Annotated[Optional[list[Path]], typer.Option("--node-dir", help="A node directory on this "
                                  "machine: the page shows its peer ledger and held-out trend (repeatable).")] = None,
              ) -> None:
    """Join as an observer (client mode, no training) and serve a web dashboard."""
    from swarm_node.observe.observer import run_dashboard

    setup_logging()
    if not initial_peer:
        typer.secho("dashboard needs --initial-peer (the multiaddr of any node of the swarm)", fg="red", err=True)
        raise typer.Exit(2)
    run_dashboard(initial_peer, swarm_id, host=host, port=port, poll_interval=poll_interval, ledger_dirs=node_dir or [])


def bootstrap(config: ConfigOpt = None, set_: SetOpt = None, initial_peer: PeerOpt = None,
              node_dir: Annotated[Path, typer.Option(help="Identity key lives here (created once).")] = Path("./bootstrap"),
              identity: Annotated[Optional[Path], typer.Option(help="Identity key file (default NODE_DIR/identity.key).")] = None,
              swarm_id: Annotated[Optional[str], typer.Option(help="Swarm name (swarm.swarm_id).")] = None,
              host_maddr: Annotated[Optional[list[str]], typer.Option(help="Listen address, e.g. /ip4/0.0.0.0/tcp/31337.")] = None,
              announce_maddr: Annotated[Optional[list[str]], typer.Option(help="Public address to announce.")] = None,
              metrics_addr: Annotated[Optional[str], typer.Option(help="host:port for /metrics.")] = None,
              verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """A DHT-only peer (no model) that nodes join through: persistent identity, /metrics."""
    from swarm_node.ops.bootstrap import BootstrapExit, run_bootstrap

    extra = [*peer_overrides(initial_peer), f"node_dir={json.dumps(str(node_dir))}"]
    extra += [f"swarm.host_maddrs={json.dumps(host_maddr)}"] if host_maddr else []
    extra += [f"swarm.announce_maddrs={json.dumps(announce_maddr)}"] if announce_maddr else []
    extra += [f"metrics.prometheus_addr={json.dumps(metrics_addr)}"] if metrics_addr else []
    extra += [f"swarm.swarm_id={json.dumps(swarm_id)}"] if swarm_id else []
    setup_logging(verbose)
    try:
        run_bootstrap(load_config(config, set_, extra), identity_file=identity)
    except BootstrapExit as e:
        typer.secho(f"bootstrap: {e}", fg="red", err=True)
        raise typer.Exit(1) from e



# (function, keyword arguments of `app.command`), in `--help` order
COMMANDS: list[tuple[Callable[..., Any], dict[str, Any]]] = [
    (seed, {}),
    (end_prompt_set, {"name": "end-prompt-set", "epilog": "Example: swarm-node end-prompt-set gsm8k-1a2b3c4d5e6f "
                      "--key-file operator.key -p /ip4/1.2.3.4/tcp/31337/p2p/Qm..."}),
    (allow_list, {"name": "allow-list"}),
    (status, {"epilog": "Example: swarm-node status -p /ip4/1.2.3.4/tcp/31337/p2p/Qm... --json"}),
    (dashboard, {}),
    (bootstrap, {}),
]
