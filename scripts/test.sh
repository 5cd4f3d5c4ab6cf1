#!/usr/bin/env bash
# The whole test suite on a fresh machine (the README's second command, and CI's):
# Debian's etcd-server and dnsmasq-base for the discovery tests (a real etcd and DNS server; Consul is a
# fake in tests/fakes), chromium and chromium-driver for the status page's browser test,
# Debian's libpython3.11 for Triton's python backend stub (it embeds libpython3.11.so.1.0, which
# Debian's python3.11 does not ship: its binary is linked statically), the virtual environment
# in .venv with the test extra, then pytest. Triton's binary comes from the nvidia-pytriton
# wheel, installed without its dependencies (docs/triton.md, "Install").
set -euo pipefail
cd "$(dirname "$0")/.."
packages=()
command -v etcd >/dev/null 2>&1 || packages+=(etcd-server)
# Debian's dnsmasq (the binary alone, no system service) as a real DNS server for the dns discovery tests
command -v dnsmasq >/dev/null 2>&1 || [ -x /usr/sbin/dnsmasq ] || packages+=(dnsmasq-base)
# Debian's haproxy (>= 2.6) for the haproxy data plane's tests (docs/data-plane.md)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || packages+=(haproxy)
# Debian's nginx-light: the benchmarks' nginx grpc_pass path and its test (scripts/benchlib.py;
# where an init system runs, Debian also starts its default site on port 80, which nothing here uses)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || packages+=(nginx-light)
# Debian's headless chromium and its chromedriver for the status page's browser test (docs/status-page.md)
command -v chromium >/dev/null 2>&1 || packages+=(chromium)
command -v chromedriver >/dev/null 2>&1 || packages+=(chromium-driver)
python3.11 - <<'PY' || packages+=(libpython3.11)
import ctypes.util, pathlib, sys, sysconfig
lib = pathlib.Path(sysconfig.get_config_var("LIBDIR") or "/", sysconfig.get_config_var("INSTSONAME") or "-")
sys.exit(0 if lib.is_file() or ctypes.util.find_library("python3.11") else 1)
PY
if [ ${#packages[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${packages[@]}" >/dev/null
fi
python3.11 -m venv .venv
# constraints.txt: the exact versions the suite last passed with (pyproject.toml has ranges)
.venv/bin/pip install -q -c constraints.txt -e '.[test]'
.venv/bin/pip install -q -c constraints.txt --no-deps 'nvidia-pytriton==0.7.0'
bash scripts/install_azurite.sh   # Microsoft's Azure Storage emulator, from npm, into .azurite/
bash scripts/install_mlserver.sh  # MLServer and its sklearn/xgboost runtimes, a venv of their own: .mlserver/
# Two test processes, one test file each at a time (module fixtures stay in one process): much of
# the suite waits on servers (Triton's exits and unloads, fault windows) rather than computing.
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
