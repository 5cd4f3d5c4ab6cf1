"""The ``tfscache`` command: one subcommand per module, imported only when chosen.

Importing lazily keeps ``tfscache serve`` and the other sidecar commands free of
tensorflow: only ``tfscache node`` loads it.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with a ``main(argv) -> int``, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "node": ("tfscache.node.main", "run the TF-Serving-compatible model server (takes tensorflow_model_server's flags)"),
    "serve": ("tfscache.serve", "run the caching front end over TF Serving nodes (embedded nodes by default)"),
    "simulate": ("tfscache.simulate", "replay a request log against eviction policies, node counts and caps"),
    "status": ("tfscache.status", "show nodes, resident models, leases and hit ratio of a running tfscache serve"),
}


def _usage() -> str:
    lines = ["usage: tfscache COMMAND [ARGS...]", "", "commands:"]
    width = max(len(name) for name in COMMANDS)
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'tfscache COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tfscache: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)
