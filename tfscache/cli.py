"""The ``tfscache`` command: one subcommand per module, imported only when chosen.

Importing lazily keeps ``tfscache serve`` and the other sidecar commands free of
tensorflow: only ``tfscache node`` loads it.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with a ``main(argv) -> int``, or "module:function", one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "node": ("tfscache.node.main", "run the TF-Serving-compatible model server (takes tensorflow_model_server's flags)"),
    "serve": ("tfscache.servecmd", "run the caching front end over TF Serving (or Triton) nodes (embedded nodes by default)"),
    "simulate": ("tfscache.simulate", "replay a request log against eviction policies, node counts and caps"),
    "status": ("tfscache.status", "show nodes, resident models, leases and hit ratio of a running tfscache serve"),
    # The admin API's client (tfscache.adminctl); each takes --address and --token.
    "models": ("tfscache.adminctl:models_main", "list the models resident on each node (size, leases, last use, pins)"),
    "pin": ("tfscache.adminctl:pin_main", "load a model if needed and never evict it"),
    "unpin": ("tfscache.adminctl:unpin_main", "let the eviction policy evict a pinned model again"),
    "preload": ("tfscache.adminctl:preload_main", "load a model and wait until it is AVAILABLE"),
    "evict": ("tfscache.adminctl:evict_main", "unload an idle model now"),
    "drain": ("tfscache.adminctl:drain_main", "drain one node, or a whole tfscache (it exits 0 when drained)"),
    "join": ("tfscache.adminctl:join_main", "put a sidecar started with --no-join on the ring (registers it)"),
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
    module_name, _, function = COMMANDS[name][0].partition(":")
    return int(getattr(importlib.import_module(module_name), function or "main")(rest) or 0)
