#!/usr/bin/env bash
# Writes constraints.txt: the exact version of every package in .venv, which CI
# (scripts/test.sh) and the Docker image (deploy/Dockerfile) install with `pip install -c`,
# so every install resolves to what the tests last passed with. pyproject.toml keeps ranges.
# Run it after changing a dependency (and `pip install -e '.[test]'`), and commit both files.
# pip is left out (the installer, not a dependency); so is tfscache itself.
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# Exact versions for reproducible installs: pip install -c constraints.txt -e '.[test]'"
  echo "# Generated from .venv by scripts/freeze_constraints.sh; the ranges are in pyproject.toml."
  .venv/bin/pip list --format=freeze --exclude-editable --disable-pip-version-check \
    | grep -v -i -E '^(pip|tfscache)==' | LC_ALL=C sort -f
} > constraints.txt
echo "constraints.txt: $(grep -c '==' constraints.txt) packages"
