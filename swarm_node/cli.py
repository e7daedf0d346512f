"""The `swarm-node` command. Thin: parse, build, run. Heavy imports happen inside commands so that
`swarm-node --help` is instant.

Every command runs under `errors.run_cli` (the `App.__call__` below), so a command added here gets
the same behaviour for free: signals handled from the first instant, expected failures as one
line with exit 2 (bad input) or 1 (runtime), tracebacks only with -v, exit 130/143 on SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from swarm_node import __version__
from swarm_node.config import NodeConfig
from swarm_node.errors import ConfigError, describe, run_cli

EXAMPLES = """
Examples:

  swarm-node local                                  # 2 nodes of the embedded model on this machine

  swarm-node train --steps 20 --node-dir runs/solo  # isolated GRPO baseline

  swarm-node join -c node.toml -p /ip4/1.2.3.4/tcp/31337/p2p/Qm...

  swarm-node doctor -c node.toml -p /ip4/1.2.3.4/tcp/31337/p2p/Qm...  # what stops a node from joining

  swarm-node status -p /ip4/1.2.3.4/tcp/31337/p2p/Qm... --json

  swarm-node status --peers --node-dir runs/a      # what node a took from each peer

  swarm-node eval --checkpoint runs/solo/checkpoints/step-00000020

  swarm-node report runs/local-20260101-120000
"""


class App(typer.Typer):
    """A typer app whose commands all run under `errors.run_cli`."""

    def __call__(self, argv: list[str] | None = None) -> Any:
        """Run with `argv` (default: sys.argv[1:]); always ends in sys.exit with the command's code."""
        command = typer.main.get_command(self)
        run_cli(lambda args: command.main(args=args, prog_name="swarm-node", standalone_mode=False), argv)


app = App(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, epilog=EXAMPLES,
          help="Collaborative GRPO (F-TIS) across a peer-to-peer swarm of different models.")

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML config file.", exists=True, dir_okay=False)]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override: section.field=value (TOML value).")]
PeerOpt = Annotated[Optional[list[str]], typer.Option("--initial-peer", "-p", help="Multiaddr of a peer to bootstrap from.")]
NodeDirOpt = Annotated[Optional[Path], typer.Option("--node-dir", help="Node directory (identity, checkpoints, logs).",
                                                    show_default="node_dir of the config: ./node")]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", min=1, help="Train until this step (train.total_steps).",
                                                 show_default="train.total_steps of the config: 100")]
DEFAULT_EVAL_PROBLEMS = 64  # `swarm-node local`: held-out problems per evaluation
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logs; tracebacks on errors.")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"swarm-node {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False,
          verbose: VerboseOpt = False) -> None:
    """Collaborative GRPO (F-TIS) across a peer-to-peer swarm of different models."""


def _setup_logging(verbose: bool = False) -> None:
    verbose = verbose or any(a in ("-v", "--verbose") for a in sys.argv[1:2])
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("hivemind", "httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not sys.stderr.isatty():  # a log file: no `\r` progress bars (set before transformers is imported)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")


def _load_config(config: Path | None, sets: list[str] | None, extra: list[str]) -> NodeConfig:
    try:
        return NodeConfig.load(config, [*extra, *(sets or [])])
    except OSError as e:
        raise ConfigError(f"cannot read config file {config}: {e.strerror or e}", "check the --config path") from e
    except ValueError as e:  # pydantic's ValidationError, TOML syntax, malformed --set
        typed = describe(e)
        where = f" ({config})" if config is not None else ""
        if typed is not None:
            raise ConfigError(typed.what + where, typed.fix) from e
        raise ConfigError(f"invalid configuration{where}: {e}", "fix the --set override or the file") from e


def _peer_overrides(peers: list[str] | None) -> list[str]:
    return [f"swarm.initial_peers={json.dumps(list(peers))}"] if peers else []


def _run_node(cfg: NodeConfig, verbose: bool) -> None:
    import importlib.util

    vllm = cfg.generation.backend == "vllm" or (cfg.generation.backend == "auto"
                                                  and importlib.util.find_spec("vllm") is not None)
    if vllm:
        # vLLM on CPU pins torch to one thread for the whole process unless OMP_NUM_THREADS is set,
        # which would leave the trainer single-threaded.
        os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    _setup_logging(verbose)
    from swarm_node.assemble import run_node

    run_node(cfg)


@app.command(epilog="Example: swarm-node join -c node.toml -p /ip4/1.2.3.4/tcp/31337/p2p/Qm...")
def join(config: ConfigOpt = None, set_: SetOpt = None, initial_peer: PeerOpt = None,
         node_dir: NodeDirOpt = None, steps: StepsOpt = None, verbose: VerboseOpt = False) -> None:
    """Run one swarm node: generate, publish, gather peers' groups, train with F-TIS."""
    extra = _peer_overrides(initial_peer)
    if node_dir is not None:
        extra.append(f"node_dir={json.dumps(str(node_dir))}")
    if steps is not None:
        extra.append(f"train.total_steps={steps}")
    _run_node(_load_config(config, set_, extra), verbose)


@app.command(epilog="Example: swarm-node doctor -c node.toml -p /ip4/1.2.3.4/tcp/31337/p2p/Qm...")
def doctor(config: ConfigOpt = None, set_: SetOpt = None, initial_peer: PeerOpt = None,
           node_dir: NodeDirOpt = None,
           as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (checks, ok, exit_code).")] = False,
           timeout: Annotated[float, typer.Option(min=1.0, help="Seconds each swarm check may wait.")] = 20.0,
           no_swarm: Annotated[bool, typer.Option("--no-swarm", help="Only the checks of this machine.")] = False,
           verbose: VerboseOpt = False) -> None:
    """Checklist before or after `join`: Python, torch, vLLM, GPU, model, disk, memory, ports, peers,
    NAT, relay, a DHT round trip, the clock. Exit 0 only when every required check passes."""
    extra = _peer_overrides(initial_peer)
    if node_dir is not None:
        extra.append(f"node_dir={json.dumps(str(node_dir))}")
    cfg = _load_config(config, set_, extra)
    _setup_logging(verbose)
    if not verbose:
        logging.getLogger().setLevel(logging.WARNING)  # the checklist is the output
    from swarm_node.doctor import run_doctor

    raise typer.Exit(run_doctor(cfg, as_json=as_json, timeout=timeout, swarm=not no_swarm))


@app.command(epilog="Example: swarm-node train --steps 20 --node-dir runs/solo -s model.name=Qwen/Qwen2.5-0.5B-Instruct")
def train(config: ConfigOpt = None, set_: SetOpt = None, node_dir: NodeDirOpt = None, steps: StepsOpt = None,
          verbose: VerboseOpt = False) -> None:
    """Isolated GRPO for N steps (the baseline): the same step as a swarm node, without peers."""
    extra = ["swarm.enabled=false", "swarm.max_peer_fraction=0.0"]
    if node_dir is not None:
        extra.append(f"node_dir={json.dumps(str(node_dir))}")
    if steps is not None:
        extra.append(f"train.total_steps={steps}")
    _run_node(_load_config(config, set_, extra), verbose)


@app.command("eval", epilog="Example: swarm-node eval --checkpoint runs/solo/checkpoints/step-00000020 --limit 100")
def eval_(config: ConfigOpt = None, set_: SetOpt = None,
          checkpoint: Annotated[Optional[Path], typer.Option(help="A checkpoint directory to evaluate (its model "
                                                              "is the one the checkpoint records).")] = None,
          limit: Annotated[int, typer.Option(min=1, help="Problems to evaluate.")] = 50,
          batch_size: Annotated[int, typer.Option(min=1)] = 8,
          max_new_tokens: Annotated[int, typer.Option(min=1)] = 256,
          as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
          verbose: VerboseOpt = False) -> None:
    """Greedy pass@1 accuracy of a model (model.name) or a checkpoint on a task."""
    _setup_logging(verbose)
    cfg = _load_config(config, set_, [])
    if checkpoint is not None:
        from swarm_node.preflight import check_checkpoint_dir

        check_checkpoint_dir(checkpoint)
    from swarm_node.assemble import run_eval

    result = run_eval(cfg, checkpoint=checkpoint, limit=limit, batch_size=batch_size,
                      max_new_tokens=max_new_tokens, progress=not as_json and sys.stderr.isatty())
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


@app.command("end-prompt-set", epilog="Example: swarm-node end-prompt-set gsm8k-1a2b3c4d5e6f --key-file operator.key "
                                      "-p /ip4/1.2.3.4/tcp/31337/p2p/Qm...")
def end_prompt_set(prompt_set_id: Annotated[str, typer.Argument(help="The id `swarm-node seed` printed.")],
                   successor: Annotated[Optional[str], typer.Option(help="Id of the set that replaces it (shown to "
                                                                              "nodes that try to load this one).")] = None,
                   swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
                   key_file: Annotated[Path, typer.Option(help="The operator key the set was seeded with.")] = Path("operator.key"),
                   initial_peer: PeerOpt = None,
                   node_dir: Annotated[Path, typer.Option(help="Directory for this command's DHT identity.")] = Path("./operator-node"),
                   ttl: Annotated[Optional[float], typer.Option(min=1.0, help="Seconds the tombstone lives (default: "
                                                                         "swarm.max_record_ttl_s, 3600).")] = None,
                   verbose: VerboseOpt = False) -> None:
    """End a seeded prompt set: store a tombstone signed by the operator key. Nodes stop re-storing the set
    (it lapses within one record TTL) and refuse to load it."""
    from swarm_node.assemble import run_end_prompt_set

    _setup_logging(verbose)
    run_end_prompt_set(prompt_set_id=prompt_set_id, successor=successor, swarm_id=swarm_id, key_file=key_file,
                       initial_peers=initial_peer or [], node_dir=node_dir, ttl_s=ttl)


@app.command("allow-list")
def allow_list(peer: Annotated[list[str], typer.Option("--peer", help="A peer id to allow (repeat the option).")],
               out: Annotated[Path, typer.Option(help="Where to write the signed allow-list.")] = Path("allow-list.json"),
               swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
               key_file: Annotated[Path, typer.Option(help="Operator signing key (the prompt-set key).")] = Path("operator.key")) -> None:
    """Sign an allow-list of peer ids for a closed swarm (nodes: swarm.allowed_peers_file)."""
    from swarm_node.swarm.allowlist import write_allow_list
    from swarm_node.swarm.identity import load_or_create_key

    peers = write_allow_list(out, swarm_id, peer, load_or_create_key(key_file))
    print(f"{out}: {len(peers)} peers of swarm {swarm_id!r}, signed by {key_file}")


@app.command(epilog="Example: swarm-node status -p /ip4/1.2.3.4/tcp/31337/p2p/Qm... --json")
def status(initial_peer: PeerOpt = None, swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
           as_json: Annotated[bool, typer.Option("--json", help="Print the records as JSON (an object with "
                                                 "`error` on failure).")] = False,
           watch: Annotated[bool, typer.Option(help="Refresh the table until Ctrl-C.")] = False,
           interval: Annotated[float, typer.Option(min=0.5)] = 5.0,
           timeout: Annotated[float, typer.Option(min=1.0, help="Seconds to wait for the swarm.")] = 20.0,
           peers: Annotated[bool, typer.Option("--peers", help="Show the peer ledger of a local node (--node-dir) "
                                               "instead: what it took from and dropped of each peer.")] = False,
           node_dir: NodeDirOpt = None,
           verbose: VerboseOpt = False) -> None:
    """Table of live peers from their status records (--peers: a local node's peer ledger)."""
    from swarm_node.errors import InputError

    _setup_logging(verbose)
    if not watch:  # one read: hivemind's DHT without torch (seconds less; see swarm/light.py)
        from swarm_node.swarm.light import load_light_hivemind

        load_light_hivemind()
    try:
        if peers:
            from swarm_node.ledger_view import run_peers_status

            return run_peers_status(node_dir or NodeConfig().node_dir, as_json=as_json, watch=watch, interval=interval)
        if not initial_peer:
            raise InputError("status needs --initial-peer", "pass the multiaddr of any node of the swarm (-p ...)")
        from swarm_node import preflight
        from swarm_node.observe import run_status

        preflight.check_initial_peers(initial_peer)
        run_status(initial_peer, swarm_id, as_json=as_json, watch=watch, interval=interval, timeout=timeout)
    except Exception as e:
        typed = describe(e)
        if as_json:  # scripts parse stdout: JSON even on failure
            print(json.dumps({"error": typed.line() if typed else f"{type(e).__name__}: {e}",
                              "exit_code": typed.exit_code if typed else 1}), flush=True)
        raise
    # The client has shut down its DHT process; skip the interpreter's teardown of torch and
    # hivemind (seconds on a busy machine) so a one-shot `status` returns at once.
    from swarm_node import lifecycle

    sys.stdout.flush()
    sys.stderr.flush()
    signum = lifecycle.received_signal()
    os._exit(lifecycle.exit_code_for(signum) if signum else 0)


@app.command()
def dashboard(initial_peer: PeerOpt = None, swarm_id: Annotated[str, typer.Option()] = "swarm-node-default",
              host: Annotated[str, typer.Option()] = "127.0.0.1",
              port: Annotated[int, typer.Option(min=0, max=65535, help="0 picks a free port.")] = 8080,
              poll_interval: Annotated[float, typer.Option(min=0.2, help="Seconds between status reads.")] = 2.0,
              node_dir: Annotated[Optional[list[Path]], typer.Option("--node-dir", help="A node directory on this "
                                  "machine whose peer ledger the page shows (repeatable).")] = None) -> None:
    """Join as an observer (client mode, no training) and serve a web dashboard."""
    from swarm_node.observe import run_dashboard

    _setup_logging()
    if not initial_peer:
        typer.secho("dashboard needs --initial-peer (the multiaddr of any node of the swarm)", fg="red", err=True)
        raise typer.Exit(2)
    run_dashboard(initial_peer, swarm_id, host=host, port=port, poll_interval=poll_interval, ledger_dirs=node_dir or [])


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


@app.command(epilog="Example: swarm-node local --nodes 3 --steps 20 --run-dir runs/demo -s model.name=tiny-random:64x1")
def local(nodes: Annotated[Optional[int], typer.Option(min=1, max=16, help="Node processes (beats `nodes` in "
                                                       "--config).", show_default="2")] = None,
          steps: Annotated[int, typer.Option(min=1, help="Steps per node.")] = 10,
          config: Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML describing the nodes.",
                                                         exists=True, dir_okay=False)] = None,
          run_dir: Annotated[Optional[Path], typer.Option(help="Where logs, checkpoints and plots go.",
                                                          show_default="runs/local-<date>-<time>")] = None,
          set_: SetOpt = None,
          stop_timeout: Annotated[float, typer.Option(min=1.0, help="On Ctrl-C/SIGTERM: seconds the nodes get to "
                                                      "finish their step and checkpoint before they are killed.")] = 120.0,
          eval_problems: Annotated[int, typer.Option(min=1, help="Held-out problems each node "
                                                     "evaluates (greedy) before its first step and after its last.")
                                   ] = DEFAULT_EVAL_PROBLEMS,
          no_eval: Annotated[bool, typer.Option("--no-eval", help="Skip the held-out evaluations.")] = False,
          verbose: VerboseOpt = False) -> None:
    """A bootstrap DHT and N nodes on this machine, with a live table and a summary."""
    _setup_logging(verbose)
    from swarm_node.local import run_local

    code = run_local(nodes=nodes, steps=steps, config=config, run_dir=run_dir, overrides=set_ or [],
                     stop_timeout=stop_timeout, eval_problems=0 if no_eval else eval_problems)
    raise typer.Exit(code)


@app.command()
def experiment(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Experiment TOML.")],
               out: Annotated[Optional[Path], typer.Option(help="Output directory (resumes what is there).")] = None,
               quick: Annotated[bool, typer.Option("--quick", help="A few steps, one seed.")] = False,
               mode: Annotated[Optional[str], typer.Option(help="lockstep or swarm (default: the file's).")] = None,
               pair: Annotated[Optional[list[str]], typer.Option(help="Run only this pair (repeatable).")] = None,
               arm: Annotated[Optional[list[str]], typer.Option(help="Run only this arm (repeatable).")] = None,
               seed: Annotated[Optional[list[int]], typer.Option(help="Run only this seed (repeatable).")] = None,
               check: Annotated[bool, typer.Option("--check", help="Pre-check only: do peers' weak-skill samples "
                                                   "survive the filters (warm models, seconds)?")] = False,
               workers: Annotated[int, typer.Option(help="Processes sharing the grid, one thread each (0: one per "
                                                    "core); then this one writes the summary.")] = 1,
               allocator: Annotated[str, typer.Option(help="Preloaded in the workers: auto (tcmalloc if "
                                                      "installed), system, or a library's path.")] = "auto",
               set_: SetOpt = None, verbose: VerboseOpt = False) -> None:
    """Run an experiment grid (arms x seeds) and write summary.md with intervals and plots.

    Several processes may run the same command on one --out directory (one thread each,
    OMP_NUM_THREADS=1): each run and warm-up is made by whichever process claims it first;
    --workers N starts N such processes and writes the summary when all have finished."""
    from swarm_node.experiment import run_experiment

    raise typer.Exit(run_experiment(file, out=out, quick=quick, mode=mode, overrides=set_ or [], verbose=verbose,
                                   pairs=pair, arms=arm, check=check, seeds=seed, workers=workers,
                                   allocator=allocator))


@app.command(epilog="Example: swarm-node report runs/local-20260101-120000")
def report(run_dir: Annotated[Path, typer.Argument(exists=True, file_okay=False)], verbose: VerboseOpt = False) -> None:
    """Write PNG plots and a markdown summary from a run's metrics logs."""
    from swarm_node.report import write_report

    path = write_report(run_dir)
    typer.echo(f"report written: {path}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
