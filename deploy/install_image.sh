#!/usr/bin/env bash
# The install steps of the v2proxy image, run by the Dockerfile and by tests/deploy (which runs
# them into a temporary venv, as no container engine is at hand there).
#
#   install_image.sh wheel SRC_DIR WHEEL_DIR [PIP_ARGS...]
#       builds the v2proxy wheel from a source tree (pyproject.toml, README.md, src/)
#   install_image.sh venv VENV WHEEL CONSTRAINTS [EXTRAS]
#       creates VENV and installs the wheel and its dependencies, pinned by CONSTRAINTS, from
#       binary wheels only (nothing compiled, so no build tools); EXTRAS e.g. "cuda". pip,
#       setuptools and wheel are then removed from VENV: the image installs nothing at run time.
#
# PYTHON picks the interpreter (default python3); pip's own variables (PIP_INDEX_URL,
# PIP_NO_CACHE_DIR, ...) apply.
set -euo pipefail

PYTHON=${PYTHON:-python3}

usage() {
    sed -n '2,13p' "$0" >&2
    exit 2
}

case "${1:-}" in
wheel)
    [ $# -ge 3 ] || usage
    src=$2 out=$3
    shift 3
    "$PYTHON" -m pip wheel --no-deps --wheel-dir "$out" "$@" "$src"
    ;;
venv)
    [ $# -ge 4 ] && [ $# -le 5 ] || usage
    venv=$2 wheel=$3 constraints=$4 extras=${5:-}
    wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
    spec=$wheel
    if [ -n "$extras" ]; then
        spec="v2proxy[$extras] @ file://$wheel"
    fi
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --only-binary=:all: -c "$constraints" "$spec"
    "$venv/bin/python" -m pip uninstall -y -q setuptools wheel pip
    "$venv/bin/v2proxy" --version
    ;;
*)
    usage
    ;;
esac
