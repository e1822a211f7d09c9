#!/usr/bin/env bash
# Regenerate src/v2proxy/_proto/*_pb2.py(i) from the .proto files with the pinned grpcio-tools.
# Usage: tools/gen_proto.sh [OUTDIR]   (default: the source folder itself)
#
# The generated modules register their messages in v2proxy's own descriptor pool
# (v2proxy._proto.POOL) instead of protobuf's default pool: tritonclient and KServe register
# the same `inference.*` names there, and a process that loads both must not clash.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
proto="$root/src/v2proxy/_proto"
out="${1:-$proto}"
python="${PYTHON:-$root/.venv/bin/python}"
# absolute paths, since the script changes directory (symlinks kept: a venv's python is one)
case "$python" in */*) python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")" ;; esac
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$proto"
"$python" -m grpc_tools.protoc -I. --python_out="$out" --pyi_out="$out" \
  grpc_service.proto health.proto
for f in "$out"/grpc_service_pb2.py "$out"/health_pb2.py; do
  sed -i 's/^from google.protobuf import descriptor_pool as _descriptor_pool$/from v2proxy._proto import POOL as _POOL/; s/_descriptor_pool\.Default()/_POOL/' "$f"
done
