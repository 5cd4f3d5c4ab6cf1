"""Fixtures for tests against a real NVIDIA Triton (tests/support/triton.py).

* ``triton_repository`` (session): a Triton model repository of python-backend models built
  once by tfscache.kinds.triton.testmodels: ``addk_1`` .. ``addk_12`` (y = x + k, no padding),
  ``addk_pad`` (y = x + 7, holding ``PADDING_BYTES`` while loaded) and ``sleep_ms``
  (y = x after ``SLEEP_MS`` ms per request).
* ``triton`` (module): a running ``tritonserver`` over that repository, explicit model
  control, nothing loaded at start (a TritonProcess; stopped after the module).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.triton import TritonProcess, start_triton

from tfscache.kinds.triton import testmodels as tritonmodels

ADDK_COUNT = 12
PADDING_BYTES = 64 * 1024 * 1024
SLEEP_MS = 300


@pytest.fixture(scope="session")
def triton_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton_repository")
    tritonmodels.build_triton_models(root, synthetic=ADDK_COUNT, sleep_ms=SLEEP_MS)
    tritonmodels.build_addk(root, 7, padding_bytes=PADDING_BYTES, name="addk_pad")
    return root


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory, triton_repository: Path
           ) -> Iterator[TritonProcess]:
    with start_triton(tmp_path_factory.mktemp("triton"), triton_repository) as server:
        yield server
