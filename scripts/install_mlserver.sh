#!/usr/bin/env bash
# MLServer and its scikit-learn and XGBoost runtimes, for the mlserver kind's tests and benchmark:
# installed into a virtual environment of their own, .mlserver/ in the repository (git-ignored),
# because MLServer 1.7 needs protobuf below 7 and the project pins 7 (docs/mlserver.md, "Install").
# tfscache finds the binary as .mlserver/bin/mlserver (tests/support/mlserver.py) or from PATH.
# Idempotent: returns at once when the pinned versions are there; otherwise about two minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=.mlserver
python="${PYTHON:-python3.11}"
# The exact versions the mlserver tests last passed with (MLServer's own dependencies come with it)
pins=(
  'mlserver==1.7.1' 'mlserver-sklearn==1.7.1' 'mlserver-xgboost==1.7.1'
  'protobuf<7'
)
stamp="$prefix/.installed"
if [ -x "$prefix/bin/mlserver" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${pins[*]}" ]; then
  exit 0
fi
[ -x "$prefix/bin/python" ] || "$python" -m venv "$prefix"
"$prefix/bin/pip" install -q "${pins[@]}"
"$prefix/bin/python" -c 'import mlserver, mlserver_sklearn, mlserver_xgboost'
echo "${pins[*]}" > "$stamp"
