#!/usr/bin/env bash
# Install size and time of the light install (issue 22): a fresh venv per row, the CPU torch
# wheel first (as docker/install.sh does), then fedweave's wheel with the given extras.
#
#   bash bench/bench_install.sh                     # `fedweave` and `fedweave[simulation]`
#   bash bench/bench_install.sh /path/to/old.whl    # ... and an older wheel as "before"
#
# Prints seconds and MB per row. Run it twice: the first run fills pip's cache.
set -euo pipefail
PYTHON="${PYTHON:-python3.11}"
work="$(mktemp -d /tmp/fedweave-install.XXXXXX)"
trap 'rm -rf "$work"' EXIT
repo="$(cd "$(dirname "$0")/.." && pwd)"
mkdir "$work/src"
tar -C "$repo" --exclude=./.git --exclude=./.venv --exclude=./.cache --exclude=./build \
    --exclude='*.egg-info' --exclude=__pycache__ --exclude=./tests --exclude=./bench -cf - . \
    | tar -C "$work/src" -xf -
builder="$repo/.venv/bin/python"; [ -x "$builder" ] || builder=python3  # setuptools, wheel
"$builder" -m pip wheel "$work/src" --no-deps --no-build-isolation -w "$work/wheel" -q
wheel="$(ls "$work"/wheel/fedweave-*.whl)"

row() {  # label, requirement
    local venv="$work/venv-$1" start end
    "$PYTHON" -m venv "$venv"
    start=$(date +%s.%N)
    "$venv/bin/pip" install -q torch==2.13.0
    end=$(date +%s.%N)
    local torch_s torch_mb
    torch_s=$(echo "$end - $start" | bc); torch_mb=$(du -sm "$venv" | cut -f1)
    start=$(date +%s.%N)
    "$venv/bin/pip" install -q "$2"
    end=$(date +%s.%N)
    printf '%-12s torch %5.1f s %5s MB | fedweave %5.1f s | venv %5s MB | %3s packages | ray: %s\n' \
        "$1" "$torch_s" "$torch_mb" "$(echo "$end - $start" | bc)" "$(du -sm "$venv" | cut -f1)" \
        "$("$venv/bin/pip" list 2>/dev/null | tail -n +3 | wc -l)" \
        "$("$venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("ray") is not None)')"
    rm -rf "$venv"
}

if [ $# -ge 1 ]; then row before "$1"; fi
row fedweave "$wheel"
row simulation "$wheel[simulation]"
