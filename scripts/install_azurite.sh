#!/usr/bin/env bash
# Azurite, Microsoft's Azure Storage emulator (npm), for the storage tests: installed into
# .azurite/ in the repository (git-ignored), never globally; tests/support/azure.py runs
# .azurite/node_modules/.bin/azurite-blob. Idempotent: returns at once when the pinned version
# is there; otherwise installs Debian's npm if missing, then `npm install` (about 30 s, 360 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
version=3.37.0
prefix=.azurite
manifest="$prefix/node_modules/azurite/package.json"
if [ -x "$prefix/node_modules/.bin/azurite-blob" ] && [ -f "$manifest" ] &&
   grep -q "\"version\": *\"$version\"" "$manifest"; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >/dev/null
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "azurite@$version" >/dev/null
"$prefix/node_modules/.bin/azurite-blob" --version >/dev/null
