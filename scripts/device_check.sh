#!/usr/bin/env bash
# The device check (python -m benchmarks.gpu_check) on a lent GPU machine: prepared here, run there.
#
# The lent machine (DESIGN section 5) has Python 3.12, torch (CUDA), transformers, peft, accelerate,
# numpy, msgpack, typer, rich, prometheus-client and pytest, no network, and none of pydantic,
# zstandard, vLLM or hivemind. The check imports no network code, so what it lacks is the project's
# small wheels: pydantic (with pydantic-core, annotated-types, typing-inspection, typing-extensions),
# msgpack and zstandard, at the versions this project's environment runs.
#
#   scripts/device_check.sh build            # here, with PyPI: the wheels into build/device-wheels (cp312)
#   scripts/device_check.sh run [ARGS...]    # there: install them into a folder, run the check
#
# `run` installs the wheels with pip --target into $DEVICE_SITE (no network, no deps), puts that folder
# first on PYTHONPATH and runs `python -m benchmarks.gpu_check --device cuda ARGS` under a time limit
# ($DEVICE_CHECK_LIMIT seconds, default 300: a lent machine has 15 minutes in all, so a failed first
# run leaves room for a second). Its output goes to $OUT/gpu_check.log and its JSON line to
# $OUT/gpu_check.json ($OUT: the folder the device runner copies back; build/device-check here when
# unset). The device tool's call, from the repository root here:
#
#   run(command="scripts/device_check.sh run", carry=["build/device-wheels"], timeout_s=420)
#
# A CPU dry run of the same path (what the script was tested with: a fresh virtual environment
# holding only torch, transformers and peft):
#
#   DEVICE_PY_VERSION=3.11 scripts/device_check.sh build
#   PYTHON=/tmp/venv/bin/python DEVICE_CHECK_LIMIT=3600 scripts/device_check.sh run --device cpu --quick
#
# Environment: PYTHON (default python3), DEVICE_WHEELS (default build/device-wheels),
# DEVICE_PY_VERSION (build: the target Python, default 3.12), DEVICE_SITE (run: default
# /tmp/swarm-node-site), DEVICE_CHECK_LIMIT (run: seconds, default 300).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${DEVICE_WHEELS:-build/device-wheels}
# the versions this project's environment runs (pip freeze of .venv); one version of each
PACKAGES=(pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
          typing_extensions==4.16.0 msgpack==1.2.4 zstandard==0.25.0)
MAX_BYTES=$((64 * 1024 * 1024))

die() { echo "device_check: $*" >&2; exit 2; }

build() {
    local version=${DEVICE_PY_VERSION:-3.12}
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS"
    local platforms=()
    for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
               manylinux2014_x86_64 manylinux1_x86_64; do
        platforms+=(--platform "$tag")
    done
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
        "${platforms[@]}" -d "$WHEELS" "${PACKAGES[@]}" \
        || die "pip could not download the wheels for Python $version (is PyPI reachable?): see the error above"
    local bytes
    bytes=$(du -cb "$WHEELS"/*.whl | tail -1 | cut -f1)
    [ "$bytes" -le "$MAX_BYTES" ] || die "$WHEELS holds $bytes bytes, over the device tool's 64 MiB: carry fewer wheels"
    echo "device_check: $(ls "$WHEELS" | wc -l) wheels for Python $version in $WHEELS ($((bytes / 1024)) KiB):"
    ls "$WHEELS"
}

run() {
    local site=${DEVICE_SITE:-/tmp/swarm-node-site}
    local limit=${DEVICE_CHECK_LIMIT:-300}
    local out=${OUT:-build/device-check}
    ls "$WHEELS"/*.whl >/dev/null 2>&1 \
        || die "no wheels in $WHEELS: run 'scripts/device_check.sh build' where PyPI is reachable and carry that folder"
    mkdir -p "$out"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$WHEELS"/*.whl || die "pip could not install $WHEELS into $site (built for another Python?): see above"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    "$PYTHON" - <<'EOF' | tee "$out/environment.txt"
import platform, torch, transformers, peft, pydantic, zstandard, msgpack
cuda = torch.cuda.is_available()
print(f"python {platform.python_version()}, torch {torch.__version__} (cuda {torch.version.cuda}, available: {cuda}),"
      f" transformers {transformers.__version__}, peft {peft.__version__}, pydantic {pydantic.VERSION},"
      f" zstandard {zstandard.__version__}, msgpack {'.'.join(map(str, msgpack.version))}; pydantic from"
      f" {pydantic.__file__.rsplit('/', 2)[0]}")
if cuda:
    print(f"gpu {torch.cuda.get_device_name(0)}, bf16 {torch.cuda.is_bf16_supported()}, "
          f"free/total {[round(x / 2**30, 1) for x in torch.cuda.mem_get_info()]} GiB")
EOF
    local args=("$@")
    [[ " $* " == *" --device "* ]] || args=(--device cuda "${args[@]}")
    set +e
    timeout --kill-after=10 "$limit" "$PYTHON" -m benchmarks.gpu_check "${args[@]}" 2>&1 | tee "$out/gpu_check.log"
    local rc=${PIPESTATUS[0]}
    set -e
    if tail -n 1 "$out/gpu_check.log" | "$PYTHON" -c "import json, sys; json.loads(sys.stdin.read())" 2>/dev/null; then
        tail -n 1 "$out/gpu_check.log" > "$out/gpu_check.json"
        echo "device_check: exit $rc; JSON in $out/gpu_check.json"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "device_check: the check ran past $limit s (DEVICE_CHECK_LIMIT) and printed no JSON: rerun with fewer --shapes" >&2
    else
        echo "device_check: the check exited $rc without its JSON line: see $out/gpu_check.log" >&2
    fi
    return "$rc"
}

case "${1:-}" in
    build) shift; build "$@" ;;
    run) shift; run "$@" ;;
    *) die "usage: scripts/device_check.sh build | run [gpu_check arguments] (see the comments at its top)" ;;
esac
