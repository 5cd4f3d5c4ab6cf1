"""`tfscache serve --workers N`: worker processes serve the front ends; the control process keeps the
caches and grants them delegated leases (docs/workers.md)."""
