"""The ``tfscache`` command: one subcommand per module, imported only when chosen.

Importing lazily keeps ``tfscache serve`` and the other sidecar commands free of
tensorflow: only ``tfscache node`` loads it. A command that needs an extra (``node``:
tensorflow) is refused before its module is imported when the extra is missing: exit
status 2 and the pip command that installs it (tfscache.extras).

Exit status, every command: 0 success, 1 the work failed (a server refused, a load
failed), 2 a mistake on the command line or in the settings, or a missing extra: said in
one line on stderr before anything started.
"""

from __future__ import annotations

import os
import signal
import sys
from importlib.metadata import PackageNotFoundError, version

from tfscache.extras import MissingExtra, require
from tfscache.importer import import_from_string

# subcommand -> (module with a ``main(argv) -> int``, or "module:function", one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "node": (
        "tfscache.modelserver.main",
        "run the TF-Serving-compatible model server (takes tensorflow_model_server's flags)",
    ),
    "serve": (
        "tfscache.cli.serve",
        "run the caching front end over model-server nodes (embedded nodes by default; --backend)",
    ),
    "simulate": (
        "tfscache.cli.simulate",
        "replay a request log against eviction policies, node counts and caps",
    ),
    "status": (
        "tfscache.cli.status",
        "show nodes, resident models, leases and hit ratio of a running tfscache serve",
    ),
    # Resizing a sidecar cluster (docs/deploy.md): plan, prewarm the new owners, drain a leaving one.
    "plan-resize": (
        "tfscache.cli.plan_resize",
        "which models change nodes when the membership changes, and their bytes",
    ),
    "prewarm": (
        "tfscache.cli.prewarm",
        "preload a resize's hot moving models on their new owners (then --join them)",
    ),
    # The admin API's client (tfscache.cli.admin); each takes --address and --token.
    "models": (
        "tfscache.cli.admin:models_main",
        "list the models resident on each node (size, leases, last use, pins)",
    ),
    "pin": ("tfscache.cli.admin:pin_main", "load a model if needed and never evict it"),
    "unpin": (
        "tfscache.cli.admin:unpin_main",
        "let the eviction policy evict a pinned model again",
    ),
    "preload": ("tfscache.cli.admin:preload_main", "load a model and wait until it is AVAILABLE"),
    "evict": ("tfscache.cli.admin:evict_main", "unload an idle model now"),
    "drain": (
        "tfscache.cli.drain",
        "drain one node, or a whole tfscache and wait until it has exited",
    ),
    "join": (
        "tfscache.cli.admin:join_main",
        "put a sidecar started with --no-join on the ring (registers it)",
    ),
}


NEEDS = {"node": "node"}  # command -> the extra it cannot start without


def package_version() -> str:
    """The installed tfscache's version (package metadata)."""
    try:
        return version("tfscache")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _usage() -> str:
    lines = ["usage: tfscache [--version] COMMAND [ARGS...]", "", "commands:"]
    width = max(len(name) for name in COMMANDS)
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'tfscache COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # the reader stopped early (``| head``): end as a command that SIGPIPE ended, quietly
        # (stdout to /dev/null, so the interpreter's own flush at exit fails no more)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"tfscache {package_version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tfscache: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if name in NEEDS and not {"-h", "--help", "--helpfull"} & set(rest):
        try:
            require(NEEDS[name], f"tfscache {name}")
        except MissingExtra as exc:
            print(f"tfscache: {exc}", file=sys.stderr)
            return 2
    target = COMMANDS[name][0]
    return int(import_from_string(target if ":" in target else f"{target}:main")(rest) or 0)
