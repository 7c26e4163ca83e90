"""Two artifacts of the same model (one built before a change, one after) in one process, calls interleaved.

    python scripts/bench_artifact_ab.py OLD_ARTIFACT NEW_ARTIFACT [--shapes 1x1,1x16,1x48,1x128] [--rounds 25]

Both are loaded with ``deploy.load`` and called through ``bind`` (inputs converted once); each round times a burst
of single calls of one, then of the other, so a change in the machine's speed lands on both alike. Prints, per
(batch, seq), the median call of each, new / old and the largest output difference. Inputs as
``bench_artifact_interleaved``'s: random token ids, a full mask, zero token types (a BERT-style encoder export).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_artifact_interleaved import _feeds  # noqa: E402
from bench_artifact_vs_static import interleaved_medians  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--shapes", default="1x1,1x16,1x48,1x128")
    ap.add_argument("--rounds", type=int, default=25)
    args = ap.parse_args()
    from tvm_fusion_ext.deploy import load

    models = {"old": load(args.old), "new": load(args.new)}
    for shape in args.shapes.split(","):
        batch, seq = (int(v) for v in shape.split("x"))
        feeds = _feeds(list(models["old"].input_specs), batch, seq)
        outs = {k: m.run(feeds) for k, m in models.items()}
        diff = max(float(np.abs(outs["old"][n] - outs["new"][n]).max()) for n in outs["old"])
        calls = {k: m.bind(feeds) for k, m in models.items()}  # inputs converted once: the calls alone are timed
        burst = max(2, int(200 / (batch * seq) ** 0.7))  # a few ms of calls at every length
        medians = interleaved_medians(calls, args.rounds, burst)
        old, new = medians["old"], medians["new"]
        print(f"({batch}, {seq}): old {old:.3f} ms, new {new:.3f} ms, new / old {new / old:.3f}, max diff {diff:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
