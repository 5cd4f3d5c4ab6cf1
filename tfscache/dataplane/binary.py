"""Is a usable ``haproxy`` installed? (``haproxy -v``: "HAProxy version 2.6.12-1 ...")."""

from __future__ import annotations

import re
import shutil
import subprocess

MINIMUM = (2, 6)
INSTALL = "apt-get install haproxy"
_VERSION = re.compile(r"HA-?Proxy version (\d+)\.(\d+)")


class HaproxyUnavailable(Exception):
    """No haproxy binary, or one older than MINIMUM: the one line says how to get one."""


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from ``haproxy -v`` output, or None if it names no version."""
    match = _VERSION.search(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def locate(binary: str = "haproxy") -> str | None:
    """The path of ``binary``: on PATH, or (a bare name) in /usr/sbin, where Debian puts it."""
    return shutil.which(binary) or (shutil.which(binary, path="/usr/sbin:/sbin")
                                    if "/" not in binary else None)


def check(binary: str = "haproxy") -> tuple[int, int]:
    """The version of ``binary``; HaproxyUnavailable if it is missing or too old.

    Called once at start-up, before the event loop runs (so it may block).
    """
    path = locate(binary)
    if path is None:
        raise HaproxyUnavailable(
            f"data plane haproxy needs the haproxy binary ({binary!r} not found): {INSTALL}")
    try:
        out = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=10)
        version = parse_version(out.stdout + out.stderr)
    except (OSError, subprocess.SubprocessError):
        version = None
    want = ".".join(map(str, MINIMUM))
    if version is None:
        raise HaproxyUnavailable(
            f"data plane haproxy: {path} -v names no version (need >= {want}): {INSTALL}")
    if version < MINIMUM:
        have = ".".join(map(str, version))
        raise HaproxyUnavailable(
            f"data plane haproxy needs haproxy >= {want}, {path} is {have}: {INSTALL}")
    return version


def available(binary: str = "haproxy") -> bool:
    """Whether ``check`` passes (for callers that choose, not fail)."""
    try:
        check(binary)
    except HaproxyUnavailable:
        return False
    return True
