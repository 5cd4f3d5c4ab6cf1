#!/usr/bin/env bash
# Regenerates tfscache/wire/*_pb2.py from protos/. The generated files are committed,
# so installing tfscache needs no protoc; run this after editing a .proto file.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. protos/tfscache/wire/*.proto
