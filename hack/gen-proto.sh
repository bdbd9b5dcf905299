#!/usr/bin/env bash
# Regenerates the Python gRPC code in dra_driver/_proto from proto/.
#
# Usage: hack/gen-proto.sh [OUT_DIR]
#   OUT_DIR defaults to dra_driver/_proto; tests pass a temporary directory
#   to check that the committed code is up to date.
#   PYTHON selects the interpreter (default: .venv/bin/python if present).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-${root}/dra_driver/_proto}"
python="${PYTHON:-}"
if [[ -z "${python}" ]]; then
  if [[ -x "${root}/.venv/bin/python" ]]; then
    python="${root}/.venv/bin/python"
  else
    python=python3
  fi
fi

cd "${root}/proto"
protos=()
while IFS= read -r f; do protos+=("${f}"); done < <(find . -name '*.proto' | sed 's|^\./||' | LC_ALL=C sort)

# Start from a clean tree so that removed protos leave no stale modules behind.
find "${out}" -name '*_pb2*.py*' -delete 2>/dev/null || true
mkdir -p "${out}"

"${python}" -m grpc_tools.protoc -I . \
  --python_out="${out}" --pyi_out="${out}" --grpc_python_out="${out}" \
  "${protos[@]}"

# Every directory becomes a package, so the modules import as
# dra_driver._proto.<dir>.api_pb2.
touch "${out}/__init__.py"
for p in "${protos[@]}"; do
  d="$(dirname "${p}")"
  while [[ "${d}" != "." ]]; do
    touch "${out}/${d}/__init__.py"
    d="$(dirname "${d}")"
  done
done

# protoc writes absolute imports ("from dra.v1 import api_pb2"); a message
# module and its service module always share a directory, so a relative import
# keeps them importable wherever the package lives.
find "${out}" -name '*_pb2_grpc.py' -print0 | while IFS= read -r -d '' f; do
  sed -E -i 's/^from [A-Za-z0-9_.]+ import (api_pb2 as [A-Za-z0-9_]+)$/from . import \1/' "${f}"
done
