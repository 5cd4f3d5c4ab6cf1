"""One node's model cache: leases, the pure planner, the reloader and its node adapters.

Import what you need from its modules (``tfscache.cache.manager.CacheManager``, ...); this
package file imports nothing, so ``tfscache.settings`` can read ``tfscache.cache.policy``'s
names without loading the cache. The layout is in ``tfscache.cache.manager``'s docstring.
"""
