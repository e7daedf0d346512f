"""The `swarm-node` command. Thin: parse, build, run. Heavy imports happen inside commands so that
`swarm-node --help` is instant. The node's and the researcher's commands are here; an operator's and
an observer's (`seed`, `end-prompt-set`, `allow-list`, `status`, `dashboard`, `bootstrap`) are in
`cli.operator`, registered below in `--help` order; the options they share are in `cli.common`.

Every command runs under `cli.common.run_cli` (the `App.__call__` below), so a command added here gets
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
from swarm_node.ops.cli import operator
from swarm_node.ops.cli.common import (ConfigOpt, NodeDirOpt, PeerOpt, SetOpt, StepsOpt, VerboseOpt, load_config,
                                   peer_overrides, quiet_progress_bars, run_cli, setup_logging)
from swarm_node.config import NodeConfig

EXAMPLES = """
Examples:

  swarm-node local                                  # 2 nodes of the embedded model on this machine

  swarm-node train --steps 20 --node-dir runs/solo  # isolated GRPO baseline

  swarm-node join -c node.toml -p /ip4/1.2.3.4/tcp/31337/p2p/Qm...

  swarm-node doctor -c node.toml -p /ip4/1.2.3.4/tcp/31337/p2p/Qm...  # what stops a node from joining

  swarm-node status -p /ip4/1.2.3.4/tcp/31337/p2p/Qm... --json

  swarm-node status --peers --node-dir runs/a      # what node a took from each peer

  swarm-node status --given runs/a -p /ip4/...     # what peers say they took from node a (receipts)

  swarm-node eval --checkpoint runs/solo/checkpoints/step-00000020

  swarm-node report runs/local-20260101-120000
"""


class App(typer.Typer):
    """A typer app whose commands all run under `cli.common.run_cli`."""

    def __call__(self, argv: list[str] | None = None) -> Any:
        """Run with `argv` (default: sys.argv[1:]); always ends in sys.exit with the command's code."""
        command = typer.main.get_command(self)
        run_cli(lambda args: command.main(args=args, prog_name="swarm-node", standalone_mode=False), argv)


DEFAULT_EVAL_PROBLEMS = 64  # `swarm-node local`: held-out problems per evaluation

app = App(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, epilog=EXAMPLES,
          help="Collaborative GRPO (F-TIS) across a peer-to-peer swarm of different models.")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"swarm-node {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False,
          verbose: VerboseOpt = False) -> None:
    """Collaborative GRPO (F-TIS) across a peer-to-peer swarm of different models."""


def _run_node(cfg: NodeConfig, verbose: bool) -> None:
    import importlib.util

    vllm = cfg.generation.backend == "vllm" or (cfg.generation.backend == "auto"
                                                  and importlib.util.find_spec("vllm") is not None)
    if vllm:
        # vLLM on CPU pins torch to one thread for the whole process unless OMP_NUM_THREADS is set,
        # which would leave the trainer single-threaded.
        os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    setup_logging(verbose)
    from swarm_node.node.assemble import run_node

    run_node(cfg)


@app.command(epilog="Example: swarm-node join -c node.toml -p /ip4/1.2.3.4/tcp/31337/p2p/Qm...")
def join(config: ConfigOpt = None, set_: SetOpt = None, initial_peer: PeerOpt = None,
         node_dir: NodeDirOpt = None, steps: StepsOpt = None, verbose: VerboseOpt = False) -> None:
    """Run one swarm node: generate, publish, gather peers' groups, train with F-TIS."""
    extra = peer_overrides(initial_peer)
    if node_dir is not None:
        extra.append(f"node_dir={json.dumps(str(node_dir))}")
    if steps is not None:
        extra.append(f"train.total_steps={steps}")
    _run_node(load_config(config, set_, extra), verbose)


@app.command(epilog="Example: swarm-node doctor -c node.toml -p /ip4/1.2.3.4/tcp/31337/p2p/Qm...")
def doctor(config: ConfigOpt = None, set_: SetOpt = None, initial_peer: PeerOpt = None,
           node_dir: NodeDirOpt = None,
           as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (checks, ok, exit_code).")] = False,
           timeout: Annotated[float, typer.Option(min=1.0, help="Seconds each swarm check may wait.")] = 20.0,
           no_swarm: Annotated[bool, typer.Option("--no-swarm", help="Only the checks of this machine.")] = False,
           verbose: VerboseOpt = False) -> None:
    """Checklist before or after `join`: Python, torch, vLLM, GPU, model, disk, memory, ports, peers,
    NAT, relay, a DHT round trip, the clock. Exit 0 only when every required check passes."""
    extra = peer_overrides(initial_peer)
    if node_dir is not None:
        extra.append(f"node_dir={json.dumps(str(node_dir))}")
    cfg = load_config(config, set_, extra)
    setup_logging(verbose)
    if not verbose:
        logging.getLogger().setLevel(logging.WARNING)  # the checklist is the output
    from swarm_node.ops.doctor import run_doctor

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
    _run_node(load_config(config, set_, extra), verbose)


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
    setup_logging(verbose)
    cfg = load_config(config, set_, [])
    if checkpoint is not None:
        from swarm_node.node.preflight import check_checkpoint_dir

        check_checkpoint_dir(checkpoint)
    from swarm_node.ops.evaluate import run_eval

    result = run_eval(cfg, checkpoint=checkpoint, limit=limit, batch_size=batch_size,
                      max_new_tokens=max_new_tokens, progress=not as_json and sys.stderr.isatty())
    from swarm_node.evaluation.stats import wilson

    lo, hi = wilson(result["correct"], result["n"]) if result["n"] else (0.0, 1.0)  # 95% interval
    if as_json:
        print(json.dumps({**{k: v for k, v in result.items() if k != "records"}, "lo": lo, "hi": hi}))
    else:
        typer.echo(f"accuracy {result['accuracy']:.3f} [95%: {lo:.3f}, {hi:.3f}] ({result['correct']}/{result['n']}) "
                   f"on {cfg.task.name} in {result['seconds']:.1f}s")


for _command, _kwargs in operator.COMMANDS:
    app.command(**_kwargs)(_command)


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
    setup_logging(verbose)
    from swarm_node.ops.local import run_local

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
    quiet_progress_bars()
    from swarm_node.experiment import run_experiment

    raise typer.Exit(run_experiment(file, out=out, quick=quick, mode=mode, overrides=set_ or [], verbose=verbose,
                                   pairs=pair, arms=arm, check=check, seeds=seed, workers=workers,
                                   allocator=allocator))


@app.command(epilog="Example: swarm-node report runs/local-20260101-120000")
def report(run_dir: Annotated[Path, typer.Argument(exists=True, file_okay=False)], verbose: VerboseOpt = False) -> None:
    """Write PNG plots and a markdown summary from a run's metrics logs."""
    from swarm_node.observe.report import write_report

    path = write_report(run_dir)
    typer.echo(f"report written: {path}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
