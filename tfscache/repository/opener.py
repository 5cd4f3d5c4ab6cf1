"""Which model repository ``tfscache serve`` reads: a local directory, or a bucket behind a disk tier.

    repository = open_repository(settings, state_dir, events=TierMetrics(registry))
    await repository.start()

A local ``model_repository`` is a ``tfscache.repository.local.ModelRepository``. An ``s3://``,
``gs://`` or ``az://`` URL is a ``tfscache.repository.bucket.RemoteRepository`` over a
``DiskTier`` in ``storage.cache_dir`` (default: ``disk-tier/`` in the instance's state
directory), bounded by ``storage.cache_bytes``. The storage extra (obstore) is imported
only then; without it, start-up stops with the pip command that installs it.
"""

from __future__ import annotations

from pathlib import Path

from tfscache.repository.local import FlatLayout, ModelRepository
from tfscache.settings import Settings, SettingsError, remote_url

STORAGE_EXTRA = "pip install 'tfscache[storage]'"


def tier_dir(settings: Settings, state_dir: Path) -> Path:
    """The disk tier's directory: ``storage.cache_dir``, else ``STATE_DIR/disk-tier``."""
    return (
        Path(settings.storage.cache_dir) if settings.storage.cache_dir else state_dir / "disk-tier"
    )


def open_repository(settings: Settings, state_dir: Path, *, events=None,
                    layout: FlatLayout | None = None) -> ModelRepository:
    """The repository ``settings.model_repository`` names (not started: ``await start()``).
    ``layout``: the node kind's flat models (its row's), in a directory or a bucket alike."""
    url = settings.model_repository
    if not remote_url(url):
        return ModelRepository(url, layout=layout)
    try:
        from tfscache.storage import open_store  # noqa: PLC0415 (obstore: only for a bucket)
        from tfscache.repository.bucket import RemoteRepository  # noqa: PLC0415
        from tfscache.storage.tier import DiskTier  # noqa: PLC0415
        store = open_store(url)  # obstore's store classes are imported here
    except ImportError as exc:
        raise SettingsError(
            f"bad value for setting model_repository: {url!r} (a bucket needs the storage "
            f"extra, which is not installed: {exc.name}; install it with: {STORAGE_EXTRA})"
        ) from None
    tier = DiskTier(
        tier_dir(settings, state_dir),
        settings.storage.cache_bytes,
        store,
        parallel=settings.storage.parallel_downloads,
        rescan_s=settings.storage.list_interval_s,
        list_rate=settings.storage.list_rate,
        list_active_s=settings.storage.list_active_s,
        events=events,
        flat_file=layout.settings_file if layout is not None else "",
    )
    return RemoteRepository(url, tier, rescan_s=settings.storage.list_interval_s, layout=layout)
