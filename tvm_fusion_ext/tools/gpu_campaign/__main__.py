"""``python -m tvm_fusion_ext.tools.gpu_campaign build|run DIR``: see the package docstring."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import speed

PARTS = ("numerics", "dense", "attention", "norms")
#: seconds a part is expected to take on an H100/H200 (numerics: ~40 small libraries, each loaded and checked)
EXPECTED_S = {"numerics": 60, **speed.EXPECTED_S}


def _parts(text: str):
    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"unknown part(s) {', '.join(unknown)} (known: {', '.join(PARTS)})")
    return parts


def build(out_dir: Path, arch: str, parts, quick: bool) -> None:
    from .target import campaign_target

    out_dir.mkdir(parents=True, exist_ok=True)
    target = campaign_target(arch)
    manifest = {"arch": arch, "quick": quick, "parts": {}}
    for part in parts:
        start = time.time()
        if part == "numerics":
            from . import numerics

            numerics.build(out_dir / part, arch)
        else:
            speed.build(out_dir / part, part, target, quick)
        manifest["parts"][part] = {"expected_s": EXPECTED_S[part], "built_s": round(time.time() - start, 1)}
        (out_dir / "campaign.json").write_text(json.dumps(manifest, indent=1))
    size = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
    print(f"campaign in {out_dir}: {', '.join(parts)} for {arch}, {size / 2**20:.1f} MiB; expected run "
          f"{sum(EXPECTED_S[p] for p in parts)} s")


def run(in_dir: Path, parts, json_out: Path) -> int:
    from .device import run_device
    from .numerics import TORCH_DEVICE, torch_time

    manifest = json.loads((in_dir / "campaign.json").read_text())
    parts = [p for p in (parts or list(manifest["parts"])) if p in manifest["parts"]]
    for p in parts:
        print(f"part {p}: expected {manifest['parts'][p]['expected_s']} s", flush=True)
    dev, torch_device, name = run_device(manifest["arch"])
    TORCH_DEVICE[0] = torch_device
    import tvm

    results = {"device": name, "arch": manifest["arch"], "tvm": tvm.__version__, "parts": {}}
    failed = 0
    for part in parts:
        start = time.time()
        if part == "numerics":
            from . import numerics

            failed += numerics.run(in_dir / part, in_dir / part / "numerics.json")
            results["parts"][part] = json.loads((in_dir / part / "numerics.json").read_text())
        else:
            rows = speed.run(in_dir / part, dev, torch_device, torch_time)
            failed += sum("error" in r for r in rows)
            results["parts"][part] = {"cases": rows}
        results["parts"][part]["took_s"] = round(time.time() - start, 1)
        json_out.write_text(json.dumps(results, indent=1))
    print(table(results))
    return 1 if failed else 0


def table(results: dict) -> str:
    """One line per case: part, name, ok / error, ours (ms), torch (ms), ratio."""
    lines = [f"{results['device']} ({results['arch']}, TVM {results['tvm']})",
             f"{'part':<10} {'case':<44} {'check':<6} {'ours ms':>9} {'torch ms':>9} {'ours/torch':>10}"]
    for part, data in results["parts"].items():
        for row in data.get("cases", []):
            check = ("ok" if row.get("ok") else "FAIL") if "ok" in row else ("ERR" if "error" in row else "")
            ms = lambda k: f"{row[k] * 1e3:9.3f}" if k in row else f"{'':>9}"  # noqa: E731
            ratio = f"{row['ours_over_torch']:10.2f}" if "ours_over_torch" in row else f"{'':>10}"
            lines.append(f"{part:<10} {row['name'][:44]:<44} {check:<6} {ms('ours_s')} {ms('torch_s')} {ratio}")
        lines.append(f"{part:<10} took {data.get('took_s', 0)} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tvm_fusion_ext.tools.gpu_campaign",
                                 description="Build a GPU campaign here (nvcc), run it there (TVM runtime only).")
    sub = ap.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("build", help="compile every part's libraries into DIR")
    b.add_argument("dir")
    b.add_argument("--arch", default="sm_90", help="sm_80, sm_90, or llvm (a rehearsal on this CPU)")
    b.add_argument("--parts", default=",".join(PARTS))
    b.add_argument("--quick", action="store_true", help="one small case per speed part (tests, rehearsals)")
    r = sub.add_parser("run", help="run the parts built in DIR (tvm.runtime, numpy and torch only)")
    r.add_argument("dir")
    r.add_argument("--parts", default="", help="a subset of the built parts (default: all)")
    r.add_argument("--json", default="campaign.json.out", help="where to write the results")
    args = ap.parse_args(argv)
    if args.mode == "build":
        build(Path(args.dir), args.arch, _parts(args.parts), args.quick)
        return 0
    in_dir = Path(args.dir)
    if not (in_dir / "campaign.json").is_file():
        raise SystemExit(f"{in_dir}: no campaign.json (build it first: ... build {in_dir} --arch sm_90)")
    return run(in_dir, _parts(args.parts) if args.parts else None, Path(args.json))


if __name__ == "__main__":
    sys.exit(main())
