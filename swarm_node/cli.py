"""The `swarm-node` command. Thin: parse, build, run. Heavy imports happen inside commands so that
`swarm-node --help` is instant."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from swarm_node.config import NodeConfig

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Collaborative GRPO (F-TIS) across a peer-to-peer swarm of different models.")

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML config file.", exists=True, dir_okay=False)]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override: section.field=value (TOML value).")]
PeerOpt = Annotated[Optional[list[str]], typer.Option("--initial-peer", "-p", help="Multiaddr of a peer to bootstrap from.")]
NodeDirOpt = Annotated[Optional[Path], typer.Option("--node-dir", help="Node directory (identity, checkpoints, logs).")]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", min=1, help="Train until this step (train.total_steps).")]


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("hivemind", "httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _load_config(config: Path | None, sets: list[str] | None, extra: list[str]) -> NodeConfig:
    try:
        return NodeConfig.load(config, [*extra, *(sets or [])])
    except (ValueError, OSError) as e:  # pydantic's ValidationError is a ValueError
        typer.secho(f"invalid configuration: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from e


def _peer_overrides(peers: list[str] | None) -> list[str]:
    return [f"swarm.initial_peers={json.dumps(list(peers))}"] if peers else []


def _run_node(cfg: NodeConfig, verbose: bool) -> None:
    if cfg.generation.backend == "vllm":
        # vLLM on CPU pins torch to one thread for the whole process unless OMP_NUM_THREADS is set,
        # which would leave the trainer single-threaded.
        os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    from swarm_node.assemble import run_node

    _setup_logging(verbose)
    run_node(cfg)


@app.command()
def join(config: ConfigOpt = None, set_: SetOpt = None, initial_peer: PeerOpt = None,
         node_dir: NodeDirOpt = None, steps: StepsOpt = None,
         verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Run one swarm node: generate, publish, gather peers' groups, train with F-TIS."""
    extra = _peer_overrides(initial_peer)
    if node_dir is not None:
        extra.append(f"node_dir={json.dumps(str(node_dir))}")
    if steps is not None:
        extra.append(f"train.total_steps={steps}")
    _run_node(_load_config(config, set_, extra), verbose)


@app.command()
def train(config: ConfigOpt = None, set_: SetOpt = None, node_dir: NodeDirOpt = None, steps: StepsOpt = None,
          verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Isolated GRPO for N steps (the baseline): the same step as a swarm node, without peers."""
    extra = ["swarm.enabled=false", "swarm.max_peer_fraction=0.0"]
    if node_dir is not None:
        extra.append(f"node_dir={json.dumps(str(node_dir))}")
    if steps is not None:
        extra.append(f"train.total_steps={steps}")
    _run_node(_load_config(config, set_, extra), verbose)


@app.command("eval")
def eval_(config: ConfigOpt = None, set_: SetOpt = None,
          checkpoint: Annotated[Optional[Path], typer.Option(help="A checkpoint directory to evaluate.")] = None,
          limit: Annotated[int, typer.Option(min=1, help="Problems to evaluate.")] = 50,
          batch_size: Annotated[int, typer.Option(min=1)] = 8,
          max_new_tokens: Annotated[int, typer.Option(min=1)] = 256,
          as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False) -> None:
    """Greedy pass@1 accuracy of a model (model.name) or a checkpoint on a task."""
    from swarm_node.assemble import run_eval

    _setup_logging()
    cfg = _load_config(config, set_, [])
    result = run_eval(cfg, checkpoint=checkpoint, limit=limit, batch_size=batch_size,
                      max_new_tokens=max_new_tokens, progress=not as_json)
    if as_json:
        print(json.dumps({k: v for k, v in result.items() if k != "records"}))
    else:
        typer.echo(f"accuracy {result['accuracy']:.3f} ({result['correct']}/{result['n']}) "
                   f"on {cfg.task.name} in {result['seconds']:.1f}s")


@app.command()
def seed(task: Annotated[str, typer.Option(help="arithmetic, gsm8k or math500.")] = "gsm8k",
         source: Annotated[Optional[str], typer.Option(help="Hub dataset id or local .jsonl path.")] = None,
         name: Annotated[Optional[str], typer.Option(help="Human-readable name of the prompt set.")] = None,
         swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
         key_file: Annotated[Path, typer.Option(help="Operator signing key (created if missing, mode 0600).")] = Path("operator.key"),
         initial_peer: PeerOpt = None,
         node_dir: Annotated[Path, typer.Option(help="Directory for the seeder's DHT identity.")] = Path("./seeder"),
         hold: Annotated[float, typer.Option(help="Seconds to keep serving and republishing; 0 = until Ctrl-C.")] = 0.0) -> None:
    """Publish a prompt set as a signed manifest plus content-addressed chunks."""
    from swarm_node.assemble import run_seed

    _setup_logging()
    run_seed(task=task, source=source, name=name, swarm_id=swarm_id, key_file=key_file,
             initial_peers=initial_peer or [], node_dir=node_dir, hold=hold)


@app.command()
def status(initial_peer: PeerOpt = None, swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
           as_json: Annotated[bool, typer.Option("--json", help="Print the records as JSON.")] = False,
           watch: Annotated[bool, typer.Option(help="Refresh the table until Ctrl-C.")] = False,
           interval: Annotated[float, typer.Option(min=0.5)] = 5.0,
           timeout: Annotated[float, typer.Option(min=1.0)] = 20.0) -> None:
    """Table of live peers from their status records."""
    from swarm_node.observe import run_status

    _setup_logging()
    if not initial_peer:
        typer.secho("status needs --initial-peer (the multiaddr of any node of the swarm)", fg="red", err=True)
        raise typer.Exit(2)
    run_status(initial_peer, swarm_id, as_json=as_json, watch=watch, interval=interval, timeout=timeout)
    # The client has shut down its DHT process; skip the interpreter's teardown of torch and
    # hivemind (seconds on a busy machine) so a one-shot `status` returns at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@app.command()
def dashboard(initial_peer: PeerOpt = None, swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
              host: Annotated[str, typer.Option()] = "127.0.0.1",
              port: Annotated[int, typer.Option(min=0, max=65535, help="0 picks a free port.")] = 8080,
              poll_interval: Annotated[float, typer.Option(min=0.2, help="Seconds between status reads.")] = 2.0) -> None:
    """Join as an observer (client mode, no training) and serve a web dashboard."""
    from swarm_node.observe import run_dashboard

    _setup_logging()
    if not initial_peer:
        typer.secho("dashboard needs --initial-peer (the multiaddr of any node of the swarm)", fg="red", err=True)
        raise typer.Exit(2)
    run_dashboard(initial_peer, swarm_id, host=host, port=port, poll_interval=poll_interval)


@app.command()
def bootstrap(config: ConfigOpt = None, set_: SetOpt = None, initial_peer: PeerOpt = None,
              node_dir: Annotated[Path, typer.Option(help="Identity key lives here (created once).")] = Path("./bootstrap"),
              identity: Annotated[Optional[Path], typer.Option(help="Identity key file (default NODE_DIR/identity.key).")] = None,
              swarm_id: Annotated[Optional[str], typer.Option(help="Swarm name (swarm.swarm_id).")] = None,
              host_maddr: Annotated[Optional[list[str]], typer.Option(help="Listen address, e.g. /ip4/0.0.0.0/tcp/31337.")] = None,
              announce_maddr: Annotated[Optional[list[str]], typer.Option(help="Public address to announce.")] = None,
              metrics_addr: Annotated[Optional[str], typer.Option(help="host:port for /metrics.")] = None,
              verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """A DHT-only peer (no model) that nodes join through: persistent identity, /metrics."""
    from swarm_node.bootstrap import BootstrapExit, run_bootstrap

    extra = [*_peer_overrides(initial_peer), f"node_dir={json.dumps(str(node_dir))}"]
    extra += [f"swarm.host_maddrs={json.dumps(host_maddr)}"] if host_maddr else []
    extra += [f"swarm.announce_maddrs={json.dumps(announce_maddr)}"] if announce_maddr else []
    extra += [f"metrics.prometheus_addr={json.dumps(metrics_addr)}"] if metrics_addr else []
    extra += [f"swarm.swarm_id={json.dumps(swarm_id)}"] if swarm_id else []
    _setup_logging(verbose)
    try:
        run_bootstrap(_load_config(config, set_, extra), identity_file=identity)
    except BootstrapExit as e:
        typer.secho(f"bootstrap: {e}", fg="red", err=True)
        raise typer.Exit(1) from e


@app.command()
def local(nodes: Annotated[int, typer.Option(min=1, max=16, help="Node processes.")] = 2,
          steps: Annotated[int, typer.Option(min=1, help="Steps per node.")] = 6,
          config: Annotated[Optional[Path], typer.Option("--config", help="TOML describing the nodes.", exists=True)] = None,
          run_dir: Annotated[Optional[Path], typer.Option(help="Where logs, checkpoints and plots go.")] = None,
          set_: SetOpt = None) -> None:
    """A bootstrap DHT and N nodes on this machine, with a live table and a summary."""
    from swarm_node.local import run_local

    _setup_logging()
    code = run_local(nodes=nodes, steps=steps, config=config, run_dir=run_dir, overrides=set_ or [])
    raise typer.Exit(code)


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(exists=True, file_okay=False)]) -> None:
    """Write PNG plots and a markdown summary from a run's metrics logs."""
    from swarm_node.report import write_report

    path = write_report(run_dir)
    typer.echo(f"report written: {path}")


if __name__ == "__main__":
    app()
