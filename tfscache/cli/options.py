"""What every ``tfscache`` command shares on its command line: output switches, checked values.

Output, the same in every command that shows progress (simulate, plan-resize, prewarm, drain):

* results go to stdout; progress bars and summary lines go to stderr;
* ``--progress`` always shows the progress bar, ``--no-progress`` never does; without
  either it shows only when stderr is a terminal;
* ``--quiet`` (``-q``) prints only results and errors: no bar, no summary lines.
  It cannot be combined with ``--progress``.

Mistakes: ``Parser`` reports a bad flag in one line on stderr, ``tfscache CMD: error: argument
--FLAG: 'VALUE' ...``, and exits 2 (argparse would print the whole usage first). The ``type=``
functions here reject a bad value with a message naming it.
"""

from __future__ import annotations

import argparse
import logging
import os


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (and exit status 2)."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_output_flags(parser: argparse.ArgumentParser, *, summary: bool = True) -> None:
    """``--progress``, ``--no-progress`` and ``--quiet`` (``summary``: the command has summary lines)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--progress", dest="progress", action="store_true", default=None,
                       help="always show the progress bar on stderr (default: only on a terminal)")
    group.add_argument(
        "--no-progress", dest="progress", action="store_false", help="never show the progress bar"
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="only results and errors: no progress bar" + (", no summary lines" if summary else ""),
    )


def bar_disable(args: argparse.Namespace) -> bool | None:
    """tqdm's ``disable=`` for these flags: True (hidden), False (shown), None (only on a terminal)."""
    if args.quiet:
        return True
    return None if args.progress is None else not args.progress


def host_port(text: str) -> str:
    """HOST:PORT with a port 1..65535 (IPv6 hosts in brackets)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return text


def non_negative(convert):
    """A ``type=`` that converts with ``convert`` (int, float) and refuses values below 0."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value != value or value < 0:  # NaN, negative
            raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0")
        return value
    parse.__name__ = convert.__name__
    return parse


def positive(convert):
    """A ``type=`` like ``non_negative`` that refuses 0 too."""
    check = non_negative(convert)

    def parse(text: str):
        value = check(text)
        if value == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
        return value
    parse.__name__ = convert.__name__
    return parse


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(text: str) -> int:
    """A logging level by name (any case; also $TFSCACHE_LOG_LEVEL) or number -> its number."""
    name = text.strip().upper()
    if name.isdigit():
        return int(name)
    if name in LOG_LEVELS or name == "WARN":
        return logging.getLevelName("WARNING" if name == "WARN" else name)
    raise argparse.ArgumentTypeError(f"{text!r} is not a log level ({', '.join(LOG_LEVELS)})")


def add_admin_flags(
    parser: argparse.ArgumentParser, default_address: str, *, ring_names: bool = False
) -> None:
    """``--address`` and ``--token`` of a command that calls the admin API (``$TFSCACHE_ADMIN_ADDRESS``
    and ``$TFSCACHE_ADMIN_TOKEN`` by default). ``ring_names``: the address may instead be a ring
    name, turned into HOST:PORT by ``--address-template``."""
    default = os.environ.get("TFSCACHE_ADMIN_ADDRESS", default_address)
    if ring_names:
        parser.add_argument("--address", default=default,
                            help="the admin API, HOST:PORT, or a ring name with --address-template "
                                 "(default %(default)s, or $TFSCACHE_ADMIN_ADDRESS)")
        parser.add_argument("--address-template", default="", metavar="TEMPLATE",
                            help="turns a ring name into HOST:PORT, e.g. '{node}.tfscache:8502'")
    else:
        parser.add_argument(
            "--address",
            type=host_port,
            default=default,
            help="the admin API, HOST:PORT (default %(default)s, or $TFSCACHE_ADMIN_ADDRESS)",
        )
    add_token_flag(parser)


def add_token_flag(parser: argparse.ArgumentParser) -> None:
    """``--token``: the admin token (``server.admin_token``), ``$TFSCACHE_ADMIN_TOKEN`` by default."""
    parser.add_argument("--token", default=os.environ.get("TFSCACHE_ADMIN_TOKEN", ""),
                        help="admin token (server.admin_token; default $TFSCACHE_ADMIN_TOKEN), "
                             "sent as 'authorization: Bearer TOKEN'")
