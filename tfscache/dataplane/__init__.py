"""HAProxy as tfscache's data plane (issue 31; docs/data-plane.md).

This first landing holds the start-up check of the ``haproxy`` binary (binary.py). The
``server.data_plane`` setting defaults to ``python``; ``haproxy`` is refused at start-up
until the config writer, process supervisor and runtime client land.
"""
