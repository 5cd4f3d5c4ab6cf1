"""Fixtures shared by every test suite.

* ``test_models``: TF Serving's test SavedModels (docs/upstream/tfserving.md,
  "Test SavedModels"), built
  once per session with support.models.tfserving: half_plus_two (versions 123, 124),
  half_plus_three, half_plus_two_tf2, saved_model_save,
  saved_model_save_multiple_signatures, each ``test_models / NAME``.
* ``synthetic_models``: a factory building ``addk_<k>`` models (y = x + k) of a chosen
  size: ``synthetic_models([1, 2], size_bytes=1_000_000) -> [Path, Path]`` (base paths
  named ``addk_<k>``; built once per (k, size, versions) per session).
* ``support.node.start_node`` starts real nodes (see tests/support/node.py).
* ``_private_state_home`` (session, autouse): ``XDG_STATE_HOME`` points at a directory of
  the session's own, in ``os.environ`` so subprocesses inherit it: no test writes to the
  real user's state directory (``tfscache.settings.statedir``'s default).

The builders use explicit ``tf.Graph``s and ``tf.saved_model.save``, so they work in a
test process that has already imported tensorflow (the tensorflow_serving stubs do).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("xdg_state_home")
    saved = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(home)
    yield home
    if saved is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = saved


@pytest.fixture(scope="session")
def test_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from support.models import tfserving as testmodels

    root = tmp_path_factory.mktemp("test_models")
    testmodels.build_test_models(root)
    return root


@pytest.fixture(scope="session")
def synthetic_models(tmp_path_factory: pytest.TempPathFactory
                     ) -> Callable[..., list[Path]]:
    from support.models import tfserving as testmodels

    built: dict[tuple[int, int, tuple[int, ...]], Path] = {}

    def build(ks: Iterable[int] | int, size_bytes: int = 0, versions: Iterable[int] = (1,)) -> list[Path]:
        ks = range(1, ks + 1) if isinstance(ks, int) else ks
        versions = tuple(versions)
        paths = []
        for k in ks:
            key = (k, size_bytes, versions)
            if key not in built:
                directory = tmp_path_factory.mktemp(
                    f"synthetic-{size_bytes}-{'_'.join(map(str, versions))}", numbered=True)
                built[key] = testmodels.build_addk(directory, k, size_bytes, versions)
            paths.append(built[key])
        return paths

    return build
