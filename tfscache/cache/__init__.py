"""One node's model cache: leases, the pure planner, the reloader and its node adapters.

The front end and admin use ``CacheManager`` (``tfscache.cache.manager``); see that module
for the layout of the package.
"""

from tfscache.cache.events import CacheEvents
from tfscache.cache.ledger import LOADING, READY, UNLOADING, Key, QueuedLoad, ResidentModel
from tfscache.cache.manager import CacheManager, Lease
from tfscache.cache.settings import CacheSettings

__all__ = ["LOADING", "READY", "UNLOADING", "CacheEvents", "CacheManager", "CacheSettings", "Key", "Lease",
           "QueuedLoad", "ResidentModel"]
