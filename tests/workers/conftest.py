"""Fixtures for `tfscache serve --workers N` (tfscache.workers).

* ``workers_repo``: addk_1 .. addk_6 (y = x + k) for the session.
* ``worker_pids(serve)``: the pids of a serve's worker processes (its children running
  tfscache.workers.worker), read from /proc through psutil.
"""

from __future__ import annotations

import psutil
import pytest

from frontend.serving import link_repository


@pytest.fixture(scope="session")
def workers_repo(synthetic_models, tmp_path_factory):
    return link_repository(tmp_path_factory.mktemp("workers") / "models", synthetic_models(6))


def worker_pids(pid: int) -> list[int]:
    """The live worker processes under serve process ``pid``."""
    pids = []
    for child in psutil.Process(pid).children():
        try:
            if "tfscache.workers.worker" in child.cmdline():
                pids.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(pids)
