"""``python -m tvm_fusion_ext.tools.tuning_lab <pool|replay|compare> ...``: one entry for the lab's commands."""

from __future__ import annotations

import sys

COMMANDS = {
    "pool": "candidate pools: collect | pack | remeasure | refeature | records | info",
    "replay": "replay search strategies over the pools, without measurement noise",
    "compare": "model-guided against random search on one model, measured",
}
USAGE = ("usage: python -m tvm_fusion_ext.tools.tuning_lab {pool,replay,compare} ...\n\n"
         + "\n".join(f"  {name:<8} {what}" for name, what in COMMANDS.items()))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "pool":
        from .pool_cli import main as run
    elif command == "replay":
        from .replay import main as run
    elif command == "compare":
        from .compare import main as run
    else:
        print(f"error: unknown tuning-lab command '{command}' (use {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    raise SystemExit(main())
