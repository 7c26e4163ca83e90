"""``tvm-fusion compile MODEL.onnx -o OUT``: compile once into an artifact directory that ``tvm-fusion run`` and
:func:`tvm_fusion_ext.deploy.load` run on any machine with TVM's runtime (see :mod:`tvm_fusion_ext.compile.artifact`)."""

from __future__ import annotations

import os
import time

from ..errors import InputError

from ..fileio import human_size
from .common import add_model_args, add_precision_arg, add_remove_padding_arg, load_npz, max_shapes_arg, shapes_arg

#: generated sample inputs for the accuracy contract: sets, and the batch × sequence of dynamic dims
CONTRACT_SETS, CONTRACT_BATCH, CONTRACT_SEQ = 3, 2, 32


def cmd_compile(args) -> int:
    from ..compile.artifact import check_destination, compile_artifact
    from ..compile.precision import check_precision

    from ..compile.kv_cache import check_kv_cache

    precision = check_precision(args.precision)
    kv_cache = check_kv_cache(args.kv_cache)
    check_destination(args.output)  # before minutes of compiling
    samples, source = (None, "given")
    if precision != "fp32":
        samples, source = contract_samples(args)
    elif args.calibration:
        raise InputError("--calibration measures a bf16 or int8 compilation against fp32: add --precision")
    t0 = time.perf_counter()
    manifest = compile_artifact(args.model, args.output, target=args.target, logs=args.logs, shapes=shapes_arg(args),
                                max_shapes=max_shapes_arg(args), fuse_graph=not args.no_fusion,
                                remove_padding=args.remove_padding, precision=precision, samples=samples,
                                samples_source=source, kv_cache=kv_cache)
    print(describe(manifest, args.output, time.perf_counter() - t0))
    accuracy = (manifest.get("precision") or {}).get("accuracy")
    if accuracy is not None and not accuracy["passed"]:
        worst = min(((n, e) for n, e in accuracy["outputs"].items() if "min_cosine" in e),
                    key=lambda item: item[1]["min_cosine"])
        print(f"error: {precision} accuracy contract fails: output {worst[0]} row cosine to fp32 down to "
              f"{worst[1]['min_cosine']:.6f} (< {accuracy['min_cosine_required']}); {args.output}/manifest.json "
              f"records it (precision.accuracy.passed = false)")
        return 1
    return 0


def contract_samples(args):
    """The sample inputs of the accuracy contract (and int8's calibration): ``--calibration`` (one .npz, one
    array per input), else generated ones (:func:`~tvm_fusion_ext.compile.calibration.generated_samples`), dynamic
    dims at :data:`CONTRACT_BATCH` × :data:`CONTRACT_SEQ`."""
    from ..compile.calibration import generated_samples

    if args.calibration:
        return [load_npz(args.calibration)], args.calibration
    sets = generated_samples(args.model, shapes_arg(args) or {}, CONTRACT_SETS, CONTRACT_BATCH, CONTRACT_SEQ)
    return sets, sets.description


def describe(manifest: dict, out: str, seconds: float) -> str:
    """What ``compile`` wrote, for the terminal."""
    lines = [f"wrote {out}/ in {seconds:.1f} s, for {manifest['target']['string']}"]
    files = dict(manifest["files"])
    files["manifest.json"] = {"bytes": os.path.getsize(os.path.join(out, "manifest.json"))}
    for name, entry in sorted(files.items()):
        lines.append(f"  {name:<14} {human_size(entry['bytes']):>10}")
    dims = manifest.get("dims") or {}
    for spec in manifest["inputs"]:
        lines.append(f"  input  {spec['name']}: {spec['dtype']}[{', '.join(map(str, spec['shape']))}]")
    for name, b in dims.items():
        why = b.get("why") or {}
        lines.append(f"  dim    {name}: {b['min']} .. {b['max'] if b['max'] is not None else 'unbounded'}"
                     + (f"  (max: {why['max']})" if why.get("max") else "")
                     + (f"  (min: {why['min']})" if why.get("min") else ""))
    fusion = manifest.get("fusion")
    lines.append("  fused  " + (", ".join(f"{k} {v}" for k, v in fusion["fused"].items()) if fusion
                                else "nothing (--no-fusion)"))
    if fusion and fusion.get("padding_removed"):
        lines.append("  padding removed: token-wise operators run on the valid tokens of attention_mask only")
    records = manifest["records"]
    lines.append(f"  tuning records: {records['note']}")
    if "not_transferred" in records:  # --logs given
        kernels = sum(int(t.get("kernels", 1)) for t in records["transferred"])
        lines.append(f"  tuned knobs: {kernels} kernel{'s' if kernels != 1 else ''} took knobs transferred from "
                     f"records of the same signature"
                     + (f" ({records['not_transferred']} records could not transfer)"
                        if records.get("not_transferred") else ""))
    precision = manifest.get("precision") or {}
    if precision.get("precision", "fp32") != "fp32":
        done = ", ".join(f"{k} {v}" for k, v in precision["converted"].items()) or "none"
        lines.append(f"  precision {precision['precision']}: weights converted in {done}"
                     + (f" (kernels use {', '.join(precision['features'])})" if precision["features"] else ""))
        lines += [f"  note: {n}" for n in precision.get("notes", [])]
        if precision.get("accuracy") is not None:
            from ..compile.accuracy import describe as describe_accuracy

            lines += ["  " + ln for ln in describe_accuracy(precision["accuracy"]).splitlines()]
    kv = manifest.get("kv_cache") or {}
    if kv.get("mode") == "inplace":
        shown = ", ".join(kv["past_inputs"][:2]) + (", ..." if len(kv["past_inputs"]) > 2 else "")
        lines.append(f"  kv cache in place: {shown} are buffers of {kv['capacity']} positions, written at input "
                     f"{kv['length_input']} (present outputs are the same buffers)")
    checked = manifest["target"]["cpu"]["checked_features"]
    lines.append(f"  needs CPU features: {', '.join(checked) if checked else 'none beyond the architecture'}")
    return "\n".join(lines)


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a model once into an artifact directory (library + weights + "
                                       "manifest) for `run`, `bench` and tvm_fusion_ext.deploy.load")
    add_model_args(p)
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="artifact directory to write (an earlier "
                                                                         "artifact there is replaced)")
    p.add_argument("--target", default="llvm",
                   help="llvm (this CPU, default), llvm:CPU (an LLVM CPU name, e.g. llvm:x86-64-v3 to run on any "
                        "AVX2 machine), cuda or cuda:sm_80 / cuda:sm_90")
    p.add_argument("--logs", help="tuning-log directory (or a root of them) to apply")
    p.add_argument("--no-fusion", action="store_true", help="compile without the fusion passes")
    add_remove_padding_arg(p)
    add_precision_arg(p)
    p.add_argument("--kv-cache", choices=("concat", "inplace"), default="concat",
                   help="a KV-cache decoder's cache: concat (default: as exported, past and new keys/values "
                        "concatenated into present, a copy of the cache per step) or inplace (each past input a "
                        "buffer of the past dim's --max-shape bound, the step's keys/values written into it at the "
                        "new input past_length; present outputs are those buffers)")
    p.add_argument("--calibration", metavar="X.npz",
                   help="with --precision bf16|int8: inputs (one array per ONNX input name) to measure the "
                        "accuracy contract on, against fp32 (default: generated inputs)")
    p.set_defaults(func=cmd_compile)
