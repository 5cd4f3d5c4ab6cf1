#!/usr/bin/env bash
# MLServer and its scikit-learn and XGBoost runtimes, for the mlserver kind (tests, benchmark, users):
# installed into a virtual environment of their own, .mlserver/ in the repository (git-ignored),
# because MLServer 1.7 needs protobuf below 7 and tfscache pins 7 (docs/mlserver.md, "Install").
# scripts/mlserver-constraints.txt holds every package at the exact version the mlserver tests last
# passed with (uvloop 0.21: with 0.22+ MLServer 1.7.1's inference workers die at start).
# Idempotent: returns at once when that set is installed; otherwise a few minutes (about 1.2 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=.mlserver
python="${PYTHON:-python3.11}"
constraints=scripts/mlserver-constraints.txt
stamp="$prefix/.installed"
want="$(sha256sum "$constraints" | cut -d' ' -f1)"
if [ -x "$prefix/bin/mlserver" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$prefix/bin/python" ] || "$python" -m venv "$prefix"
"$prefix/bin/pip" install -q -c "$constraints" mlserver mlserver-sklearn mlserver-xgboost uvloop protobuf
"$prefix/bin/python" -c 'import mlserver, mlserver_sklearn, mlserver_xgboost'
echo "$want" > "$stamp"
