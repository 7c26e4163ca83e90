"""``tvm-fusion bench``: argument checks and dispatch to :mod:`tvm_fusion_ext.tools.bench`."""

from __future__ import annotations

from typing import Callable, List, Optional

from ..deploy.manifest import is_artifact
from ..errors import InputError
from ..tools.bench.lengths import parse_lengths
from ..tools.bench.model import DEFAULT_BATCH, DEFAULT_SEQ
from ..tools.bench.report import RUNTIMES
from .common import add_precision_arg, add_remove_padding_arg, load_npz


def parse_against(text: Optional[str], known=RUNTIMES, default=None) -> List[str]:
    if text is None:
        return list(default or known)
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in known]
    if bad or not items:
        raise InputError(f"--against: unknown runtime '{bad[0] if bad else text}' (choose from {','.join(known)})")
    return [r for r in known if r in items]


def parse_seqs(text: str) -> List[int]:
    try:
        seqs = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise InputError(f"--seq: expected comma-separated positive integers, got '{text}'") from None
    if not seqs or any(s <= 0 for s in seqs):
        raise InputError(f"--seq: expected comma-separated positive integers, got '{text}'")
    return seqs


def run_bench(args, out: Callable[[str], None] = print) -> dict:
    """What ``tvm-fusion bench`` does with its parsed arguments (validation first: bad flags fail fast)."""
    from ..tools.bench import bench_attention, bench_dense, bench_gated, bench_model

    if args.decode or args.past is not None:
        return _finish(args, _bench_decode(args, out), out)
    if args.kernels and (args.gated or args.dense or args.attention_only):
        raise InputError("--kernels profiles a model or an artifact, not --gated, --dense or --attention-only")
    if args.gated:
        if args.model is not None or args.attention_only or args.plot or args.dense:
            raise InputError("--gated takes no model file, --attention-only, --dense or --plot")
        result = bench_gated(args.gated, repeat=args.repeat or 30, spin=args.spin, out=out)
    elif args.dense:
        if args.model is not None or args.attention_only or args.plot:
            raise InputError("--dense takes no model file, --attention-only or --plot")
        result = bench_dense(args.dense, act=args.act, repeat=args.repeat or 50, spin=args.spin, out=out)
    elif args.attention_only:
        if args.model is not None:
            raise InputError("--attention-only takes no model file")
        seqs = parse_seqs(args.seq or "512,1024,2048")
        if args.heads <= 0 or args.head_dim <= 0:
            raise InputError("--heads and --head-dim must be positive")
        result = bench_attention(seqs, heads=args.heads, head_dim=args.head_dim, repeat=args.repeat,
                                 spin=args.spin, out=out)
    else:
        if args.model is None:
            raise InputError("bench needs a MODEL.onnx or an artifact directory (or --attention-only)")
        seq = parse_seqs(args.seq)[0] if args.seq else None
        if args.seq and len(parse_seqs(args.seq)) > 1:
            raise InputError("--seq takes one length in model mode")
        if args.batch is not None and args.batch <= 0:
            raise InputError("--batch must be positive")
        if args.repeat is not None and args.repeat <= 0:
            raise InputError("--repeat must be positive")
        if is_artifact(args.model) and (args.lengths or args.remove_padding):
            raise InputError("--lengths and --remove-padding apply to an ONNX model, not to an artifact")
        feeds = None
        if args.inputs:
            given = [flag for flag, value in (("--seq", args.seq), ("--batch", args.batch),
                                              ("--lengths", args.lengths)) if value]
            if given:
                raise InputError(f"--inputs gives every input's shape: drop {given[0]}")
            feeds = load_npz(args.inputs)
        if is_artifact(args.model):
            return _finish(args, _bench_artifact(args, seq, out, feeds), out)
        if args.onnx:
            raise InputError("--onnx is for an artifact: MODEL is the ONNX file itself here")
        from ..compile.precision import check_precision
        from ..tools.bench.precision_peers import LOW_PRECISION_RUNTIMES

        precision = check_precision(args.precision)
        against = parse_against(args.against, RUNTIMES + LOW_PRECISION_RUNTIMES, RUNTIMES)
        result = bench_model(args.model, logs=args.logs, against=against, seq=seq, batch=args.batch,
                             target=args.target, repeat=args.repeat or 20, torch_model=args.torch, spin=args.spin,
                             out=out, lengths=parse_lengths(args.lengths), seed=args.seed,
                             remove_padding=args.remove_padding, feeds=feeds, kernels=args.kernels,
                             precision=precision)
    return _finish(args, result, out)


def _bench_decode(args, out):
    from ..tools.bench.decode import DECODE_RUNTIMES, bench_decode

    if not args.decode:
        raise InputError("--past applies to --decode")
    if args.past is None:
        raise InputError("--decode needs --past P (the cached tokens each row attends to)")
    if args.model is None:
        raise InputError("--decode needs a MODEL.onnx or an artifact directory")
    other = [flag for flag, value in (("--seq", args.seq), ("--lengths", args.lengths), ("--inputs", args.inputs),
                                      ("--gated", args.gated), ("--dense", args.dense),
                                      ("--attention-only", args.attention_only),
                                      ("--plot", args.plot), ("--torch", args.torch),
                                      ("--remove-padding", args.remove_padding), ("--target", args.target != "llvm"))
             if value]
    if other:
        raise InputError(f"--decode times one generation step: drop {other[0]}")
    if args.repeat is not None and args.repeat <= 0:
        raise InputError("--repeat must be positive")
    return bench_decode(args.model, past=args.past, batch=1 if args.batch is None else args.batch, onnx=args.onnx,
                        repeat=args.repeat or 20, against=parse_against(args.against, DECODE_RUNTIMES),
                        spin=args.spin, logs=args.logs, seed=args.seed, kernels=args.kernels, out=out)


def _bench_artifact(args, seq, out, feeds=None):
    from ..tools.bench import ARTIFACT_RUNTIMES, bench_artifact
    from ..tools.bench.artifact import DEFAULT_ARTIFACT_RUNTIMES

    compile_flags = [flag for flag, value in (("--logs", args.logs), ("--target", args.target != "llvm"),
                                              ("--precision", args.precision)) if value]
    if compile_flags:
        raise InputError(f"{compile_flags[0]} applies when compiling; {args.model} is an artifact, compiled already")
    return bench_artifact(args.model, onnx=args.onnx, against=parse_against(args.against, ARTIFACT_RUNTIMES,
                                                                                  DEFAULT_ARTIFACT_RUNTIMES),
                          seq=seq, batch=args.batch, repeat=args.repeat or 20, spin=args.spin,
                          torch_model=args.torch, out=out, feeds=feeds, kernels=args.kernels)


def _finish(args, result, out):
    from ..tools.bench import plot, write_json

    if args.json:
        write_json(args.json, result)
        out(f"wrote {args.json}")
    if args.plot:
        plot(args.plot, result)
        out(f"wrote {args.plot}")
    return result


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="time this package against ONNX Runtime, torch and stock TVM "
                                     "(or attention kernels alone)")
    p.add_argument("model", nargs="?", help="ONNX model file, or an artifact directory from `tvm-fusion compile` "
                                            "(not with --attention-only)")
    p.add_argument("--onnx", help="artifact mode: the ONNX file for ONNX Runtime, torch and the in-process build "
                                  "(default: the source recorded in the artifact, if unchanged)")
    p.add_argument("--logs", help="tuning-log directory to apply to this package's build")
    p.add_argument("--against", help=f"comma-separated runtimes to compare with (default {','.join(RUNTIMES)}; "
                                     f"for an artifact: ort, torch, build = the same model built in this process; "
                                     f"also static = built for exactly the benchmarked shapes; model mode also "
                                     f"ort-int8 = ORT on quantize_dynamic(per_channel=True) of the file, "
                                     f"torch-bf16 = torch under CPU bf16 autocast)")
    p.add_argument("--seq", help=f"sequence length for dynamic dims / our exports (default: the model's, or "
                                 f"{DEFAULT_SEQ}); with --attention-only a list, e.g. 512,1024,2048")
    p.add_argument("--batch", type=int, help=f"batch size for dynamic dims / our exports (default: the model's, "
                                             f"or {DEFAULT_BATCH})")
    p.add_argument("--lengths", metavar="MIN-MAX",
                   help="model mode: a variable-length batch, each sequence's length uniform in [MIN, MAX] "
                        "(seeded), padded to the longest with attention_mask zeros; every runtime runs it")
    p.add_argument("--inputs", metavar="X.npz",
                   help="time on these inputs (one array per ONNX input name, as `run --inputs` takes) instead of "
                        "generated ones: a KV-cache decoder's past tensors, real token ids; sets every shape")
    p.add_argument("--seed", type=int, default=0, help="--lengths: seed of numpy's default_rng (default 0)")
    add_remove_padding_arg(p)
    p.add_argument("--target", default="llvm", help="llvm (default) or cuda (needs a GPU)")
    p.add_argument("--repeat", type=int, help="timed runs per runtime (default 20; attention: 10/5/3 by length; "
                                              "stock TVM: 3, capped at 10 s)")
    p.add_argument("--torch", choices=["minilm", "bert-base"],
                   help="the transformers model the ONNX file was exported from, when the file does not record "
                        "it (exports by tvm_fusion_ext.models.export_hf_model do)")
    p.add_argument("--spin", action="store_true",
                   help="let ORT, torch and TVM worker threads busy-wait between parallel regions (their defaults: "
                        "fastest on an idle machine, much slower on a shared one; off by default, for all alike)")
    p.add_argument("--kernels", action="store_true",
                   help="model or artifact: also time each compiled kernel of our call inside the VM and print where "
                        "the call's time goes (the JSON's 'kernels'); with ONNX Runtime in --against, its call "
                        "split per operator type by its own profiler too (the JSON's 'ort_kernels')")
    p.add_argument("--decode", action="store_true",
                   help="time one generation step of a KV-cache decoder (one new token per row against --past "
                        "cached tokens; inputs built from the model's names) against ONNX Runtime, with the bytes "
                        "it streams, achieved GB/s and the host's read bandwidth measured in the same run")
    p.add_argument("--past", type=int, metavar="P", help="--decode: cached tokens per row (0 = the first step)")
    p.add_argument("--json", help="write all results to this JSON file")
    p.add_argument("--plot", help="write a bar chart (PNG) to this file")
    p.add_argument("--attention-only", action="store_true",
                   help="benchmark the attention kernel alone: ours vs torch SDPA vs unfused Relax")
    p.add_argument("--dense", metavar="MxKxN", help="benchmark fused_dense alone at this shape (GFLOP/s)")
    p.add_argument("--gated", metavar="MxKxN",
                   help="benchmark a SwiGLU gate/up pair alone at this shape (N: intermediate width): "
                        "fused_gated_dense vs the pipeline without it vs torch eager")
    add_precision_arg(p, "model mode: ")
    p.add_argument("--act", default="gelu", help="--dense: epilogue activation (default gelu)")
    p.add_argument("--heads", type=int, default=12, help="attention-only: heads (default 12)")
    p.add_argument("--head-dim", type=int, default=64, help="attention-only: head dim (default 64)")
    p.set_defaults(func=run_bench_command)


def run_bench_command(args) -> int:
    run_bench(args)
    return 0

