# Sourced by scripts/docker_test.sh: the image's checks. Needs: DOCKER, IMAGE, PROJECT, RUN_DIR,
# LOG_DIR, log, die. Each check prints what it saw; SUMMARY collects JSON fields.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

check_help() {
  local out
  out=$("$DOCKER" run --rm --network none "$IMAGE" --help) || die "docker run $IMAGE --help failed"
  for cmd in join train dashboard; do
    grep -qw "$cmd" <<<"$out" || die "docker run $IMAGE --help does not list '$cmd'"
  done
  log "--help lists join, train, dashboard"
}

# `train` with a tiny model on a named volume: metrics.jsonl has a row per step and a checkpoint is
# on the volume after the container is gone.
check_train() {
  local vol="$PROJECT-train" steps=3 t0=$SECONDS
  "$DOCKER" volume create "$vol" >/dev/null
  VOLUMES+=("$vol")
  "$DOCKER" run --rm --network none -v "$vol:/data" "$IMAGE" train --node-dir /data/node --steps "$steps" \
    --set 'model.name="tiny-random:64x1:a"' --set 'model.cache_dir="/data/cache"' --set 'model.device="cpu"' \
    --set generation.group_size=4 --set generation.max_new_tokens=8 --set train.prompts_per_step=2 \
    --set task.size=50 --set 'task.levels=[1]' > "$LOG_DIR/train.log" 2>&1 \
    || { tail -n 20 "$LOG_DIR/train.log" >&2; die "train in the image failed (log: $LOG_DIR/train.log)"; }
  local seen
  seen=$("$DOCKER" run --rm --network none -v "$vol:/data" --entrypoint python "$IMAGE" -c '
import json, pathlib
node = pathlib.Path("/data/node")
rows = [json.loads(l) for l in (node / "metrics.jsonl").read_text().splitlines() if l.strip()]
ckpts = sorted(p.name for p in (node / "checkpoints").glob("step-*"))
print(json.dumps({"steps": sorted({int(r["step"]) for r in rows}), "checkpoints": ckpts[:5]}))') \
    || die "could not read the train volume"
  python3 -c '
import json, sys
seen, n = json.loads(sys.argv[1]), int(sys.argv[2])
assert seen["steps"] == list(range(1, n + 1)), "metrics.jsonl steps: %s, expected 1..%d" % (seen["steps"], n)
assert seen["checkpoints"], "no checkpoint on the volume"' "$seen" "$steps" || die "train on a volume: $seen"
  "$DOCKER" volume rm "$vol" >/dev/null
  log "train: $steps steps on volume $vol in $((SECONDS - t0)) s: $seen"
  SUMMARY+=("\"train\": $seen")
}

compose() { "$DOCKER" compose -p "$PROJECT" -f deploy/compose.yaml --env-file "$RUN_DIR/compose.env" "$@"; }

# The compose file's stack with tiny models: bootstrap, node-a (full), node-b (LoRA), dashboard,
# until both nodes have trained on each other's samples; then both /metrics and the dashboard.
check_compose() {
  local t0=$SECONDS pa pb pd
  pa=$(free_port); pb=$(free_port); pd=$(free_port)
  printf 'SWARM_NODE_IMAGE=%s\nNODE_CONFIG=./node.tiny.toml\nNODE_THREADS=1\n' "$IMAGE" > "$RUN_DIR/compose.env"
  printf 'NODE_A_METRICS_PORT=127.0.0.1:%s\nNODE_B_METRICS_PORT=127.0.0.1:%s\nDASHBOARD_PORT=127.0.0.1:%s\n' \
    "$pa" "$pb" "$pd" >> "$RUN_DIR/compose.env"
  COMPOSE_UP=1
  local id
  id=$(compose run --rm -T bootstrap-identity 2> "$LOG_DIR/identity.log" | tr -d '\r' | tail -n 1) \
    || { cat "$LOG_DIR/identity.log" >&2; die "compose run bootstrap-identity failed"; }
  [[ "$id" =~ ^(Qm|12D3)[1-9A-HJ-NP-Za-km-z]+$ ]] || die "bootstrap-identity printed '$id', not a peer id"
  echo "BOOTSTRAP_PEER_ID=$id" >> "$RUN_DIR/compose.env"
  compose up -d --no-build --pull never > "$LOG_DIR/compose-up.log" 2>&1 \
    || { cat "$LOG_DIR/compose-up.log" >&2; die "compose up failed"; }
  log "compose up: bootstrap $id; waiting until both nodes train on each other's samples"
  local state deadline=$((SECONDS + ${DOCKER_TEST_SWARM_TIMEOUT:-420}))
  while :; do
    state=$(_swarm_state)
    python3 -c 'import json,sys; s=json.loads(sys.argv[1]); sys.exit(0 if all(s[n]["peer_samples"] > 0 for n in s) else 1)' \
      "$state" && break
    if ((SECONDS > deadline)); then
      compose logs --tail 40 >&2 || true
      die "the nodes did not train on each other's samples in time: $state"
    fi
    _restarted && { compose logs --tail 40 >&2; die "a container restarted (logs above): $state"; }
    sleep 10
  done
  log "both nodes trained on peer samples after $((SECONDS - t0)) s: $state"
  _scrape "$pa" "$pb" "$pd"
  compose stop -t 120 > "$LOG_DIR/compose-stop.log" 2>&1 || die "compose stop failed"
  local codes
  codes=$(for s in node-a node-b; do "$DOCKER" inspect -f '{{.State.ExitCode}}' "$(compose ps -a -q "$s")"; done | tr '\n' ' ')
  log "stopped; node exit codes: $codes"
  for c in $codes; do [ "$c" = 0 ] || [ "$c" = 143 ] || die "a node exited with $c on SIGTERM (0 or 143 expected)"; done
  state=$(_swarm_state stopped)
  compose down -v --remove-orphans > "$LOG_DIR/compose-down.log" 2>&1 || die "compose down failed"
  COMPOSE_UP=
  SUMMARY+=("\"compose\": {\"nodes\": $state, \"seconds_to_peer_training\": $((SECONDS - t0))}")
}

_swarm_state() {  # per node: steps, peer_samples (sum), checkpoint files; from the node volumes
  local out="{" sep="" n row
  for n in node-a node-b; do
    row=$("$DOCKER" run --rm --network none -v "${PROJECT}_$n:/data:ro" --entrypoint python "$IMAGE" -c '
import json, pathlib
p = pathlib.Path("/data/node/metrics.jsonl")
rows = [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []
ck = list(pathlib.Path("/data/node/checkpoints").glob("step-*"))
print(json.dumps({"steps": len({r["step"] for r in rows}), "peer_samples": int(sum(r.get("peer_samples", 0) for r in rows)),
                  "own_samples": int(sum(r.get("own_samples", 0) for r in rows)), "checkpoints": len(ck)}))' 2>/dev/null) \
      || row='{"steps": 0, "peer_samples": 0, "own_samples": 0, "checkpoints": 0}'
    out+="$sep\"$n\": $row"; sep=", "
  done
  echo "$out}"
}

_restarted() {
  local s c
  for s in bootstrap node-a node-b dashboard; do
    c=$(compose ps -a -q "$s")
    [ -n "$c" ] && [ "$("$DOCKER" inspect -f '{{.RestartCount}}' "$c")" != 0 ] && return 0
  done
  return 1
}

_scrape() {  # $1 $2: node-a, node-b metrics ports; $3: dashboard port
  local port name body
  for name in a b; do
    [ "$name" = a ] && port=$1 || port=$2
    body=$(curl -fsS -m 10 "http://127.0.0.1:$port/metrics") || die "node-$name /metrics on 127.0.0.1:$port did not answer"
    grep -Eq '^swarm_node_step [0-9.e+]+$' <<<"$body" || die "node-$name /metrics has no swarm_node_step"
    grep -Eq '^swarm_node_peer_samples ' <<<"$body" || die "node-$name /metrics has no swarm_node_peer_samples"
    log "node-$name /metrics: $(grep -E '^swarm_node_(step|peer_samples|loss) ' <<<"$body" | tr '\n' ' ')"
  done
  [ "$(curl -fsS -m 10 "http://127.0.0.1:$3/healthz")" = ok ] || die "dashboard /healthz did not answer ok"
  local i peers=0
  for i in $(seq 12); do  # the dashboard polls the DHT; give it a few polls to see both nodes
    peers=$(curl -fsS -m 10 "http://127.0.0.1:$3/api/peers" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["peers"]))') || peers=0
    [ "$peers" -ge 2 ] && break
    sleep 5
  done
  [ "$peers" -ge 2 ] || die "the dashboard's /api/peers lists $peers peers, expected both nodes"
  curl -fsS -m 10 "http://127.0.0.1:$3/" | grep -qi "<html" || die "the dashboard page did not load"
  log "dashboard: /healthz ok, /api/peers lists $peers peers, page served"
}
