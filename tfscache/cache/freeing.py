"""Memory a node has not given back yet: versions it reported gone whose bytes still count.

An unload can return before the memory is free: Triton's unload call does (server#4844; the
adapter also waits until the index says UNAVAILABLE), TF Serving's allocator and a GPU
backend's caching allocator give memory back late. So after the node reports versions
gone, the ledger keeps their bytes (host bytes under a memory cap, GPU bytes under a GPU
cap) as one ``Freeing`` record, and a load admitted on that room is not sent to the node
while, counting them, the node is over a cap (the pure ``planner.waits_for_freed_memory``;
``plan`` takes no further victim for them: they leave by themselves), until the record is
released (``Ledger.freed``):

* the node's measured memory has dropped, from what it was just before the unload, by at
  least ``FREED_FRACTION`` of the bytes counted (host memory with a memory cap, GPU memory
  with a GPU cap; half, because a measured size carries sampling noise), or
* ``cache.free_wait_s`` has passed since the node reported them gone (the bounded wait:
  a node that keeps memory cached for reuse would otherwise block loads forever); they
  then count as free, with a warning.

Where the node's memory cannot be read (no pid), the node's word is taken at once. With
no memory or GPU cap in force nothing is held and nothing is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

Key = tuple[str, int]

FREED_FRACTION = 0.5


@dataclass(frozen=True)
class Freeing:
    """Versions the node reported gone at once, still counted until measured free."""

    keys: tuple[Key, ...]
    bytes: int  # host bytes they were counted at
    gpu: int  # GPU bytes they were counted at
    host_before: int | None  # the node's host memory just before the unload (None: not measured)
    gpu_before: int | None  # its GPU memory then (None: not measured)
    until: float  # monotonic: counted free from then on, measured or not

    def dropped(self, host_now: int | None, gpu_now: int | None) -> bool:
        """Whether the node's measured memory shows the bytes given back."""
        return (_gave_back(self.bytes, self.host_before, host_now)
                and _gave_back(self.gpu, self.gpu_before, gpu_now))


def _gave_back(counted: int, before: int | None, now: int | None) -> bool:
    if not counted or before is None or now is None:
        return True  # nothing to wait for, or nothing to measure by: the node's word
    return now <= before - FREED_FRACTION * counted
