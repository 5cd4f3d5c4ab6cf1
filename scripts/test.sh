#!/usr/bin/env bash
# The whole test suite on a fresh machine (the README's second command, and CI's):
# Debian's etcd-server for the discovery tests (a real etcd; Consul is a fake in tests/fakes),
# the virtual environment in .venv with the test extra, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v etcd >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq etcd-server >/dev/null
fi
python3.11 -m venv .venv
.venv/bin/pip install -q -e '.[test]'
exec .venv/bin/python -m pytest "$@"
