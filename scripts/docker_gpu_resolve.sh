#!/usr/bin/env bash
# Check that the GPU install resolves to the tested versions, without downloading any wheel.
#   scripts/docker_gpu_resolve.sh
# Resolves, for Linux x86-64 and Python 3.11 (the GPU image's platform):
#   1. the Dockerfile's GPU variant: `pip install -c constraints/gpu.txt ".[gpu,report]"`;
#   2. the extra alone, as a user installs it: `pip install ".[gpu]"`;
# and fails unless both give exactly the vLLM and torch versions in constraints/gpu.txt. The
# resolver is uv's (`uv pip compile`), which reads only package metadata (ranged reads of the
# wheels where the index serves no separate metadata); `pip install --dry-run --report` resolves
# the same set but downloads every wheel (torch and vLLM alone are about 850 MB) where the index
# has no metadata files. Machine-wide pip settings (constraints, local wheel folders) are not read:
# they describe this machine, not the GPU image.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.8
if [ -z "${DOCKER_TEST_CACHE:-}" ]; then
  if [ "$(id -u)" = 0 ]; then DOCKER_TEST_CACHE=/var/cache/swarm-node-docker-test
  else DOCKER_TEST_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/swarm-node-docker-test"; fi
fi
log() { echo "[gpu-resolve] $*" >&2; }
die() { echo "[gpu-resolve] FAILED: $*" >&2; exit 1; }

pin() { sed -n "s/^$1==\([^ ]*\).*/\1/p" constraints/gpu.txt; }
want_vllm=$(pin vllm)
want_torch=$(pin torch)
[ -n "$want_vllm" ] && [ -n "$want_torch" ] || die "constraints/gpu.txt must pin vllm==X and torch==Y"
grep -Eq "^gpu = \[\"vllm==${want_vllm//./\\.}\"\]" pyproject.toml \
  || die "pyproject.toml's gpu extra must be [\"vllm==$want_vllm\"] (the version in constraints/gpu.txt)"

tools="$DOCKER_TEST_CACHE/tools"
uv="$tools/bin/uv"
if ! "$uv" --version 2>/dev/null | grep -q " $UV_VERSION"; then
  log "installing uv $UV_VERSION (PyPI) into $tools"
  mkdir -p "$DOCKER_TEST_CACHE"
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q "uv==$UV_VERSION" 2> >(grep -v -e "WARNING: Location" >&2) \
    || die "could not install uv $UV_VERSION from PyPI; check the network or the pip configuration"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
resolve() {  # $1: label, then uv pip compile arguments
  local label=$1; shift
  local t0=$SECONDS
  if ! UV_CACHE_DIR="$DOCKER_TEST_CACHE/uv" "$uv" pip compile --quiet --no-config --native-tls \
      --python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-header --no-annotate \
      "$@" pyproject.toml -o "$work/$label.txt" 2>"$work/$label.err"; then
    tail -n 20 "$work/$label.err" >&2
    die "$label: the GPU install does not resolve (see above)"
  fi
  local vllm torch n
  vllm=$(sed -n 's/^vllm==//p' "$work/$label.txt")
  torch=$(sed -n 's/^torch==//p' "$work/$label.txt")
  n=$(grep -c '==' "$work/$label.txt")
  log "$label: vllm $vllm, torch $torch ($n packages, $((SECONDS - t0)) s)"
  [ "$vllm" = "$want_vllm" ] || die "$label resolves vllm to '$vllm', tested is $want_vllm"
  [ "$torch" = "$want_torch" ] || die "$label resolves torch to '$torch', tested is $want_torch"
  echo "\"$label\": {\"vllm\": \"$vllm\", \"torch\": \"$torch\", \"packages\": $n}"
}
a=$(resolve image --extra gpu --extra report -c constraints/gpu.txt)
b=$(resolve extra --extra gpu)
echo "{\"gpu_resolve\": {$a, $b}}"
