"""Candidate pools: distinct candidates of one task's design space, each measured once, for replaying searches.

``python -m tvm_fusion_ext.tools.tuning_lab pool collect|pack|remeasure|refeature|records|info ...``: the
commands over a pool's life. ``collect`` draws and measures candidates into a resumable work directory
(``collect.py``), ``pack`` writes it as the compact ``tuning_pools/*.npz`` file (``pool_file.py``),
``remeasure`` re-times a pool file in one process (``pool_remeasure.py``), ``refeature`` recomputes its
expert features (``pool_refeature.py``), ``records`` exports it as a ``--warm-start`` record directory
(``pool_records.py``), ``info`` summarises a pool file or a work directory.
"""

from __future__ import annotations

import argparse
import sys

from ...errors import FusionExtError
from .collect import CollectOptions, collect

PROG = "python -m tvm_fusion_ext.tools.tuning_lab pool"


def main(argv=None) -> int:
    from .pool_tasks import task_names

    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="draw, build and measure candidates into WORK/<task>-<space>/ (resumable)")
    c.add_argument("--task", required=True, choices=task_names())
    c.add_argument("--space", choices=("template", "auto"), default="auto")
    c.add_argument("--count", type=int, default=1500)
    c.add_argument("--work", default="pools_work", help="root of the collection journals")
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--batch", type=int, default=16)
    c.add_argument("--random-first", type=int, default=200)
    c.add_argument("--mutation-share", type=float, default=0.4)
    c.add_argument("--give-up", type=int, default=2000)
    k = sub.add_parser("pack", help="write a work directory as a compact pool file (tuning_pools/*.npz)")
    k.add_argument("work", help="a collection directory WORK/<task>-<space>")
    k.add_argument("--out", required=True)
    r = sub.add_parser("remeasure", help="re-measure a pool file's candidates in one process, interleaved "
                                         "(pool_remeasure.py)")
    r.add_argument("pool", help="a pool file (tuning_pools/*.npz)")
    r.add_argument("--out", help="write here instead of in place")
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--min-repeat-ms", type=int, default=10)
    r.add_argument("--threads", type=int, help="TVM threads while timing (default: one per core, as the tuner)")
    r.add_argument("--target", help="rebuild and time for this target instead of the pool's ('llvm': this "
                                    "CPU), making the file this machine's (a --warm-start source here)")
    f = sub.add_parser("refeature", help="recompute a pool file's expert features from its traces, keeping its "
                                         "measurements (pool_refeature.py)")
    f.add_argument("pool", help="a pool file (tuning_pools/*.npz)")
    f.add_argument("--out", help="write here instead of in place")
    e = sub.add_parser("records", help="write a pool file's measured candidates as a tuning-record directory, "
                                       "a --warm-start source (pool_records.py)")
    e.add_argument("pool", help="a pool file (tuning_pools/*.npz)")
    e.add_argument("--out", required=True, help="a new record directory")
    i = sub.add_parser("info", help="summarise a pool file or a collection directory")
    i.add_argument("path")
    args = p.parse_args(argv)
    try:
        if args.cmd == "collect":
            opts = CollectOptions(task=args.task, space=args.space, count=args.count, seed=args.seed,
                                  batch=args.batch, random_first=args.random_first,
                                  mutation_share=args.mutation_share, give_up=args.give_up,
                                  progress=lambda m: print(m, flush=True))
            collect(args.work, opts, command=" ".join([PROG, *argv]))
        elif args.cmd == "pack":
            from .pool_file import pack

            print(pack(args.work, args.out))
        elif args.cmd == "remeasure":
            from .pool_remeasure import remeasure

            print(remeasure(args.pool, args.out, rounds=args.rounds, min_repeat_ms=args.min_repeat_ms,
                            threads=args.threads, say=lambda m: print(m, flush=True), target=args.target))
        elif args.cmd == "refeature":
            from .pool_refeature import refeature

            print(refeature(args.pool, args.out, say=lambda m: print(m, flush=True)))
        elif args.cmd == "records":
            from .pool_records import export_records

            print(export_records(args.pool, args.out))
        else:
            from .pool_file import describe

            print(describe(args.path))
    except FusionExtError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0

