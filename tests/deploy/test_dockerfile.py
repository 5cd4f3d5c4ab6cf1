"""deploy/Dockerfile: the sidecar image, parsed (no Docker engine on the build machines)."""

from __future__ import annotations

import pytest

from . import checks, manifests

DOCKERFILE = manifests.DOCKERFILE.read_text()
IGNORE = (manifests.DEPLOY / "Dockerfile.dockerignore").read_text()


def test_dockerfile_agrees_with_the_code():
    assert checks.check_dockerfile(DOCKERFILE, IGNORE) == []


def test_default_config_loads_in_sidecar_mode(tmp_path):
    config, cmd = manifests.dockerfile_default_config(DOCKERFILE)
    settings = manifests.load_sidecar_settings(config.read_text(), {}, tmp_path, tmp_path)
    assert settings.sidecar
    assert cmd[:1] == ["--config"]


def exposed() -> str:
    return " ".join(str(p) for p in manifests.sidecar_ports().values())


@pytest.mark.parametrize("old, new, why", [
    ("FROM python:3.11-slim", "FROM python:3.11", "python:3.11-slim"),
    (f"EXPOSE {exposed()}", f"EXPOSE {exposed()} 9999", "EXPOSE"),
    (f"EXPOSE {exposed()}", "EXPOSE " + " ".join(str(p + 1) for p in manifests.sidecar_ports().values()), "EXPOSE"),
    ("RUN pip install -c constraints.txt .", "RUN pip install -c constraints.txt '.[node]'", "without extras"),
    ("RUN pip install -c constraints.txt .", "RUN pip install -c constraints.txt . tensorflow==2.21.0", "tensorflow"),
    ("RUN pip install -c constraints.txt .", "RUN pip install .", "-c constraints.txt"),
    ("RUN pip install -c constraints.txt .", "RUN true", "no pip install"),
    ("COPY pyproject.toml README.md constraints.txt ./", "COPY pyproject.toml README.md ./\nCOPY .venv ./.venv",
     "excluded from the build context"),
    ("USER 10001:10001", "USER root", "non-root"),
    ('ENTRYPOINT ["tfscache", "serve"]', 'ENTRYPOINT ["tfscache", "node"]', "ENTRYPOINT"),
    ("COPY tfscache ./tfscache", "COPY tfscache ./tfscache\nCOPY tests ./tests", "excluded from the build context"),
])
def test_dockerfile_check_can_fail(old, new, why):
    assert old in DOCKERFILE, old
    problems = checks.check_dockerfile(DOCKERFILE.replace(old, new), IGNORE)
    assert any(why in p for p in problems), problems


def test_parser_joins_continuation_lines():
    instructions = manifests.parse_dockerfile("FROM x\n# c\nRUN a \\\n    && b\nEXPOSE 1\n")
    assert [(i.keyword, i.args) for i in instructions] == [("FROM", "x"), ("RUN", "a      && b"), ("EXPOSE", "1")]


def test_dockerignore_matching():
    patterns = ["*", "!tfscache/", "!deploy/sidecar.toml", "**/__pycache__"]
    assert manifests.dockerignore_allows(patterns, "tfscache")
    assert manifests.dockerignore_allows(patterns, "deploy/sidecar.toml")
    assert not manifests.dockerignore_allows(patterns, "deploy/docker-compose.yml")
    assert not manifests.dockerignore_allows(patterns, ".venv")
