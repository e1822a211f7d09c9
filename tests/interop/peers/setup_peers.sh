#!/usr/bin/env bash
# Create the virtual environments of the real peer model servers used by the
# v2proxy interop tests:
#
#   bash tests/interop/peers/setup_peers.sh [DIR [NAME...]]
#
#   DIR/kserve    <- requirements-kserve.txt   (KServe ModelServer)
#   DIR/mlserver  <- requirements-mlserver.txt (MLServer)
#   DIR/triton    <- requirements-triton.txt   (Triton Inference Server, from nvidia-pytriton)
#   DIR/aisbench  <- requirements-aisbench.txt (AISBench, whose MindieStreamApi is a MindIE client;
#                    its package imports torch: the CPU build, see that file)
#
# For Triton the venv also gets a runnable server tree, DIR/triton/tritonserver: a copy of the
# wheel's pytriton/tritonserver with the python backend stub for the venv's Python at
# backends/python/triton_python_backend_stub (see launch.py for how it is started).
#
# DIR defaults to .cache/peers under the repository root (also read from
# $V2PROXY_PEERS_DIR); a relative DIR argument is taken from the current
# directory. The packages pin conflicting dependencies, hence one venv each. NAMEs (kserve,
# mlserver, triton, aisbench) build only those.
#
# Idempotent: each venv holds a stamp with the sha256 of its requirements
# file; a venv whose stamp matches (and whose python still runs) is left
# alone, otherwise it is rebuilt from scratch. All venvs are built in
# parallel, with pip's output in DIR/NAME.install.log; while they build, every
# $SETUP_PEERS_TICK seconds (default 20) a line per venv still building says
# how long it has taken and pip's last line. Prints one line per venv at the
# end; exits non-zero if any install fails. $PYTHON picks the interpreter
# (default python3).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
PY="${PYTHON:-python3}"

DIR="${1:-${V2PROXY_PEERS_DIR:-$ROOT/.cache/peers}}"
shift || true
TICK="${SETUP_PEERS_TICK:-20}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "setup_peers: $PY not found" >&2
    exit 1
fi

# Serialise concurrent runs on the same DIR (e.g. two test sessions).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$DIR/.setup.lock"
    flock 9
fi

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        "$PY" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
    fi
}

# complete NAME: true when DIR/NAME holds everything the launcher needs besides the venv.
complete() {
    case "$1" in
        triton)
            [[ -x "$DIR/triton/tritonserver/bin/tritonserver" &&
                -x "$DIR/triton/tritonserver/backends/python/triton_python_backend_stub" ]]
            ;;
        *) return 0 ;;
    esac
}

# prepare_triton VENV: copy the wheel's server tree into VENV/tritonserver and put the python
# backend stub for the venv's Python where the python backend looks for it.
prepare_triton() {
    local venv="$1"
    local site pyver tree
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    pyver="$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    tree="$venv/tritonserver"
    if [[ ! -f "$site/pytriton/tritonserver/python_backend_stubs/$pyver/triton_python_backend_stub" ]]; then
        echo "no python backend stub for Python $pyver in nvidia-pytriton" >&2
        return 1
    fi
    if [[ ! -d "$site/nvidia_pytriton.libs" ]]; then
        echo "no nvidia_pytriton.libs in $site" >&2
        return 1
    fi
    rm -rf "$tree" &&
        cp -a "$site/pytriton/tritonserver" "$tree" &&
        cp "$tree/python_backend_stubs/$pyver/triton_python_backend_stub" \
            "$tree/backends/python/triton_python_backend_stub" &&
        chmod +x "$tree/backends/python/triton_python_backend_stub" "$tree/bin/tritonserver" &&
        rm -rf "$tree/python_backend_stubs" &&
        echo "$site/nvidia_pytriton.libs" >"$tree/LIBS_DIR" || return 1 # for LD_LIBRARY_PATH
    # --help exits 1 but lists the options only when the binary finds all its libraries
    local usage
    usage="$(LD_LIBRARY_PATH="$site/nvidia_pytriton.libs" "$tree/bin/tritonserver" --help 2>&1 || true)"
    [[ "$usage" == *--model-repository* ]] || {
        echo "tritonserver does not run: $tree/bin/tritonserver --help failed" >&2
        return 1
    }
}

# build NAME: (re)create DIR/NAME from requirements-NAME.txt unless its stamp
# matches. Writes a one-line summary to DIR/NAME.result; returns non-zero on
# failure.
build() {
    local name="$1"
    local req="$HERE/requirements-$name.txt"
    local venv="$DIR/$name"
    local stamp="$venv/.v2proxy-peer-stamp"
    local log="$DIR/$name.install.log"
    local result="$DIR/$name.result"
    local want
    want="$(sha256_of "$req")"

    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
        && "$venv/bin/python" -c 'import sys' >/dev/null 2>&1 && complete "$name"; then
        echo "$name: up to date ($venv, $("$venv/bin/python" -V 2>&1), requirements sha256 ${want:0:12})" >"$result"
        return 0
    fi

    local start=$SECONDS
    echo "$name: building its venv in $venv (pip's output in $log) ..." >&2
    rm -rf "$venv"
    # A requirement pinned to a +cpu build (torch==X+cpu) is installed first, on its own: PyPI has
    # only the CUDA build of torch (~4 GB of nvidia-* and triton wheels), PyTorch's CPU index
    # (asked for that one package only) has the CPU one. A wheel pip already has at hand (its
    # --find-links) is taken without asking the index. The -r install then finds it installed.
    local cpu
    cpu="$(grep -E '^[A-Za-z0-9_.-]+==[^[:space:]]+[+]cpu' "$req" || true)"
    if ! {
        "$PY" -m venv "$venv" &&
            if [[ -n "$cpu" ]]; then
                # shellcheck disable=SC2086 # one requirement per word
                "$venv/bin/python" -m pip install --disable-pip-version-check --no-input \
                    --no-deps --no-index $cpu ||
                    {
                        echo "setup_peers: $cpu not at hand: from https://download.pytorch.org/whl/cpu"
                        "$venv/bin/python" -m pip install --disable-pip-version-check --no-input \
                            --no-deps --index-url https://download.pytorch.org/whl/cpu $cpu
                    }
            fi &&
            "$venv/bin/python" -m pip install --disable-pip-version-check --no-input \
                -r "$req" &&
            if [[ "$name" == triton ]]; then prepare_triton "$venv"; fi
    } >"$log" 2>&1; then
        echo "$name: FAILED after $((SECONDS - start))s, see $log" >"$result"
        tail -n 25 "$log" | sed "s/^/  [$name] /" >>"$result"
        return 1
    fi
    echo "$want" >"$stamp"
    local top
    top="$(grep -m1 -E '^[A-Za-z]' "$req" || true)"
    echo "$name: installed $top in $((SECONDS - start))s ($venv, $("$venv/bin/python" -V 2>&1))" >"$result"
    echo "$name: ready after $((SECONDS - start))s" >&2
}

names=(kserve mlserver triton aisbench)
if (($#)); then
    for n in "$@"; do
        [[ -f "$HERE/requirements-$n.txt" ]] || {
            echo "setup_peers: no peer named $n (kserve, mlserver, triton, aisbench)" >&2
            exit 2
        }
    done
    names=("$@")
fi
stale=()
for n in "${names[@]}"; do
    want="$(sha256_of "$HERE/requirements-$n.txt")"
    if ! [[ -f "$DIR/$n/.v2proxy-peer-stamp" && "$(cat "$DIR/$n/.v2proxy-peer-stamp")" == "$want" ]]; then
        stale+=("$n")
    fi
done
if ((${#stale[@]})); then
    echo "setup_peers: building the peer model servers' venvs (${stale[*]}) in parallel under $DIR;" \
        "the first time this takes a few minutes (all four: 157 s on a 2-core VM near a package" \
        "mirror; pip downloads KServe, MLServer, Triton's ~55 MB wheel and AISBench's many" \
        "dependencies, torch's CPU build among them), afterwards it is instant; progress every" \
        "${TICK} s" >&2
fi
pids=()
for n in "${names[@]}"; do
    rm -f "$DIR/$n.result"
    build "$n" &
    pids+=("$!")
done

# ticker: every TICK seconds, one line per venv still building: its time so far and pip's last
# line other than a warning or a progress bar (pip writes no progress bars to a file, and resolving or installing
# can take minutes).
# It wakes every second (killed at the end, it leaves no sleep behind holding the output open)
# and ends by itself once no build is left.
ticker() {
    local t0=$SECONDS next=$((SECONDS + TICK)) i n line alive
    while sleep 1; do
        ((SECONDS >= next)) || continue
        next=$((SECONDS + TICK))
        alive=0
        for i in "${!names[@]}"; do
            n="${names[$i]}"
            kill -0 "${pids[$i]}" 2>/dev/null || continue
            alive=1
            line="$(grep -v -e '^WARNING' -e '━' "$DIR/$n.install.log" 2>/dev/null | tail -n 1 | tr -d '\r' |
                tr -s ' ' | cut -c1-110 || true)"
            echo "  $n: $((SECONDS - t0)) s, ${line:-starting}" >&2
        done
        ((alive)) || return 0
    done
}
ticker_pid=
if ((${#stale[@]})); then
    ticker &
    ticker_pid=$!
fi

rc=0
for i in "${!names[@]}"; do
    if ! wait "${pids[$i]}"; then
        rc=1
    fi
    n="${names[$i]}"
    if [[ -f "$DIR/$n.result" ]]; then
        cat "$DIR/$n.result"
        rm -f "$DIR/$n.result"
    else
        echo "$n: FAILED (no result)"
        rc=1
    fi
done
if [[ -n "$ticker_pid" ]]; then
    kill "$ticker_pid" 2>/dev/null || true
    wait "$ticker_pid" 2>/dev/null || true
fi
exit $rc
