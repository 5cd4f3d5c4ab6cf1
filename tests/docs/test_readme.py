"""The README's TF Serving example, run as written.

The first command block's venv and install steps are what the test environment already did;
``scripts/make_models.py`` runs into a tmp dir with the README's arguments, and ``tfscache
serve`` starts with the README's exact flags except the ports: gRPC/REST are bound to free ports
(port 0, read back) and ``--admin-port``/``--metrics-port`` are rewritten to 0. Each curl in the
block that follows runs with the real ``curl`` binary, on the rewritten port, and its output is
compared to the JSON the README prints in its comment; the gRPC Python snippet runs with the
official ``tensorflow_serving.apis`` stubs and prints what its comment says. The Triton and
MLServer sections are not covered yet.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.support.serving import start_serve

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def indented_blocks() -> list[list[str]]:
    blocks, current = [], []
    for line in README.splitlines():
        if line.startswith("    "):
            current.append(line[4:])
        elif current and line.strip():
            blocks.append(current)
            current = []
    return blocks + ([current] if current else [])


def serve_flags() -> tuple[list[str], list[str]]:
    first = indented_blocks()[0][0]
    make = next(p for p in first.split(" && ") if "make_models.py" in p)
    serve = next(p for p in first.split(" && ") if "tfscache serve" in p)
    argv = shlex.split(serve)[2:]
    return shlex.split(make)[2:], argv


def curls() -> list[tuple[list[str], object]]:
    block = next(b for b in indented_blocks() if b[0].startswith("curl "))
    pairs = []
    for line, comment in zip(block, block[1:]):
        if line.startswith("curl ") and comment.startswith("# {"):
            expected = json.loads(re.match(r"# (\{.*?\})", comment).group(1))
            pairs.append((shlex.split(line), expected))
    return pairs


def test_readme_tfserving_curls(tmp_path):
    make_args, argv = serve_flags()
    repo = tmp_path / "models"
    make_args = [str(repo) if a == "examples/models" else a for a in make_args]
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_models.py"), *make_args],
                   check=True, cwd=ROOT, timeout=300)
    i = argv.index("--model-repository")
    del argv[i:i + 2]
    for flag in ("--admin-port", "--metrics-port"):
        argv[argv.index(flag) + 1] = "0"
    serve = start_serve(tmp_path, repo, *argv)
    try:
        pairs = curls()
        assert len(pairs) == 2
        for command, expected in pairs:
            command = [a.replace("127.0.0.1:8501", f"127.0.0.1:{serve.rest_port}")
                       for a in command]
            out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
            assert json.loads(out.stdout) == expected, (command, out.stdout)
        snippet = re.search(r"```python\n(.*?)```", README, re.S).group(1)
        expected = re.search(r"# (\[.*?\])", snippet).group(1)
        snippet = snippet.replace("127.0.0.1:8500", f"127.0.0.1:{serve.grpc_port}")
        out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True,
                             timeout=180, check=True)
        assert out.stdout.strip().splitlines()[-1] == expected, out.stdout
    finally:
        serve.stop()
