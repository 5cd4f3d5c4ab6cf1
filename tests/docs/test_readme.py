"""The README's TF Serving example, run as written.

The first command block's venv and install steps are what the test environment already did;
``scripts/make_models.py`` runs into a tmp dir with the README's arguments, and ``tfscache
serve`` starts with the README's exact flags except the ports: gRPC/REST are bound to free ports
(port 0, read back) and ``--admin-port``/``--metrics-port`` are rewritten to 0. Each curl in the
block that follows runs with the real ``curl`` binary, on the rewritten port, and its output is
compared to the JSON the README prints in its comment; the gRPC Python snippet runs with the
official ``tensorflow_serving.apis`` stubs and prints what its comment says. The Triton and
MLServer sections run the same way: their models built as written, ``tfscache serve`` with their
flags (ports rewritten), their tritonclient snippet and their curl.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

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


def section(marker: str) -> tuple[list[str], list[str], list[list[str]]]:
    """The make_models and serve argv of the indented block that runs ``marker``, and the blocks."""
    blocks = indented_blocks()
    lines = next(b for b in blocks if any(marker in line for line in b))
    parts = [p for line in lines for p in line.split(" && ")]
    make = next(p for p in parts if "make_models.py" in p)
    serve = next(p for p in parts if "tfscache serve" in p)
    return shlex.split(make)[2:], shlex.split(serve)[2:], blocks


def run_oip_section(tmp_path, marker: str, snippet: str, curl_line: str, expected: list[str]):
    """Build the section's models as written, serve them as written (ports rewritten to 0), run
    its tritonclient snippet and its curl; the snippet prints what its comments say."""
    make_args, argv, _ = section(marker)
    repo = tmp_path / "models"
    make_args = [str(repo) if a.startswith("examples/") else a for a in make_args]
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_models.py"), *make_args],
                   check=True, cwd=ROOT, timeout=300)
    i = argv.index("--model-repository")
    del argv[i:i + 2]
    for flag in ("--admin-port", "--metrics-port"):
        if flag in argv:
            argv[argv.index(flag) + 1] = "0"
    argv = [str(ROOT / a) if a.startswith(".mlserver/") else a for a in argv]
    serve = start_serve(tmp_path, repo, *argv)
    try:
        code = snippet.replace("127.0.0.1:8500", f"127.0.0.1:{serve.grpc_port}")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=180, check=True)
        assert out.stdout.split() == expected, out.stdout
        command = [a.replace("127.0.0.1:8501", f"127.0.0.1:{serve.rest_port}")
                   for a in shlex.split(curl_line)]
        return json.loads(subprocess.run(command, capture_output=True, text=True, timeout=120,
                                         check=True).stdout)
    finally:
        serve.stop()


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


def test_readme_triton_section(tmp_path):
    snippet = next(s for s in snippets() if "is_model_ready" in s)
    _, _, blocks = section("make_models.py --triton")
    curl_block = next(b for b in blocks if "/v2/models/addk_2/infer" in b[0] and "-H" not in b[0])
    reply = run_oip_section(tmp_path, "make_models.py --triton", snippet, curl_block[0],
                            ["[3.", "4.", "7.]", "True"])
    assert reply == json.loads(curl_block[1].removeprefix("# ")), reply


def test_readme_mlserver_section(tmp_path):
    from support.mlserver import MLSERVER, SKIP_REASON
    if MLSERVER is None:
        pytest.skip(SKIP_REASON)
    snippet = next(s for s in snippets() if '"predict"' in s)
    _, _, blocks = section("make_models.py --mlserver")
    curl_line = next(b[0] for b in blocks if b[0].startswith("curl -s -H"))
    reply = run_oip_section(tmp_path, "make_models.py --mlserver", snippet, curl_line,
                            ["[[3.]", "[7.]]"])
    assert reply["model_name"] == "addk_2" and reply["outputs"][0]["data"] == [7.0], reply
