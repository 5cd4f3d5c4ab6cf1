"""Fixtures for tests against a real NVIDIA Triton (tests/support/triton.py).

* ``triton_repository`` (session): a Triton model repository of python-backend models built
  once by support.models.triton: ``addk_1`` .. ``addk_12`` (y = x + k, no padding),
  ``addk_pad`` (y = x + 7, holding ``PADDING_BYTES`` while loaded), ``sleep_ms``
  (y = x after ``SLEEP_MS`` ms per request) and the decoupled ones: ``stream_3`` (3 responses
  ``STREAM_DELAY_MS`` apart; x[0] < 0: -x[0] of them), ``stream_a`` .. ``stream_e`` (the same,
  for churn), ``sparse`` (no response when x[0] < 0); the stream models write a marker into
  ``triton_markers`` when they see a request cancelled.
* ``triton`` (module): a running ``tritonserver`` over that repository, explicit model
  control, nothing loaded at start (a TritonProcess; stopped after the module).
* ``served`` (module): ``[serve, raw]`` for a module that sets ``SERVE_ARGS``: its
  ``tfscache serve --backend triton SERVE_ARGS`` over the repository and its ``triton``, started
  (and stopped) at once; such a module's ``triton`` is this one.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.serving import start_serve
from support.triton import TritonProcess, beside_raw_triton, start_triton

from support.models import triton as tritonmodels

ADDK_COUNT = 12
PADDING_BYTES = 64 * 1024 * 1024
SLEEP_MS = 300
STREAM_DELAY_MS = 50
STREAM_MODELS = [f"stream_{c}" for c in "abcde"]


@pytest.fixture(scope="session")
def triton_markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the stream models write ``cancelled-<request id>`` when a request is cancelled."""
    return tmp_path_factory.mktemp("triton_markers")


@pytest.fixture(scope="session")
def triton_repository(tmp_path_factory: pytest.TempPathFactory, triton_markers: Path) -> Path:
    root = tmp_path_factory.mktemp("triton_repository")
    tritonmodels.build_triton_models(root, synthetic=ADDK_COUNT, sleep_ms=SLEEP_MS)
    tritonmodels.build_addk(root, 7, padding_bytes=PADDING_BYTES, name="addk_pad")
    for name in ("stream_3", *STREAM_MODELS):
        tritonmodels.build_stream(root, 3, STREAM_DELAY_MS, name=name, marker_dir=triton_markers)
    tritonmodels.build_sparse(root)
    return root


@pytest.fixture(scope="module")
def triton(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, triton_repository: Path
           ) -> Iterator[TritonProcess]:
    if hasattr(request.module, "SERVE_ARGS"):
        yield request.getfixturevalue("served")[1]
        return
    with start_triton(tmp_path_factory.mktemp("triton"), triton_repository) as server:
        yield server


@pytest.fixture(scope="module")
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, triton_repository: Path):
    start = functools.partial(start_serve, tmp_path_factory.mktemp("serve"), triton_repository, "--backend", "triton",
                              *request.module.SERVE_ARGS)
    with beside_raw_triton(start, tmp_path_factory.mktemp("triton"), triton_repository) as pair:
        yield pair
