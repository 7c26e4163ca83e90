"""``python -m tvm_fusion_ext.tools.gpu_campaign build|run DIR``: see the package docstring."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from . import carry, e2e, pool, speed

PARTS = ("numerics", "dense", "attention", "norms", "decode", "e2e", "pool")
#: seconds a part is expected to take on an H100/H200 (numerics: ~40 small libraries, each loaded and checked)
EXPECTED_S = {"numerics": 60, **speed.EXPECTED_S, "e2e": e2e.EXPECTED_S, "pool": pool.EXPECTED_S}
#: seconds ``run`` gives its parts by default: a device call is cut at 600 s, and a part started past the budget
#: could be cut before it writes its rows and the table; what does not fit is left for a second call
RUN_BUDGET_S = 560


def _parts(text: str):
    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"unknown part(s) {', '.join(unknown)} (known: {', '.join(PARTS)})")
    return parts


def build(out_dir: Path, arch: str, parts, quick: bool) -> float:
    """Build ``parts`` into ``out_dir``, print the summary; the MiB carried (campaign + bundle + checkout)."""
    from .target import campaign_target

    out_dir.mkdir(parents=True, exist_ok=True)
    target = campaign_target(arch)
    manifest = {"arch": arch, "quick": quick, "parts": {}}
    existing = out_dir / "campaign.json"
    if existing.is_file():  # parts built before into DIR for the same arch stay (built one at a time, run together)
        before = json.loads(existing.read_text())
        if (before.get("arch"), before.get("quick")) == (arch, quick):
            manifest["parts"] = {p: v for p, v in before.get("parts", {}).items() if p in PARTS and p not in parts}
    for part in parts:
        start = time.time()
        if (out_dir / part).exists():
            shutil.rmtree(out_dir / part)  # nothing of an earlier build of this part is carried
        if part == "numerics":
            from . import numerics

            numerics.build(out_dir / part, arch)
        elif part == "e2e":
            e2e.build(out_dir / part, target, quick)
        elif part == "pool":
            pool.build(out_dir / part, target, quick)
        else:
            speed.build(out_dir / part, part, target, quick)
        carry.pack(out_dir / part)
        manifest["parts"][part] = {"expected_s": EXPECTED_S[part], "built_s": round(time.time() - start, 1)}
        (out_dir / "campaign.json").write_text(json.dumps(manifest, indent=1))
    text, carried = summary(out_dir, arch, [p for p in PARTS if p in manifest["parts"]])
    print(text)
    return carried


#: what the GPU machine can be sent at once, and the runtime-only TVM bundle's share of it
CARRY_LIMIT_MIB = 64
RUNTIME_BUNDLE_MIB = 23 / 1.048576


def summary(out_dir: Path, arch: str, parts):
    """Per part: files, MiB and expected seconds there; then the carried total against the 64 MiB limit.
    Returns the text and the MiB carried (the campaign, the runtime bundle and the checkout's tracked files)."""
    lines = [f"campaign in {out_dir} for {arch}", f"{'part':<10} {'files':>6} {'MiB':>7} {'expected s':>11}"]
    total_files, total = 0, 0
    for part in parts:
        files = [f for f in (out_dir / part).rglob("*") if f.is_file()]
        size = sum(f.stat().st_size for f in files)
        total_files, total = total_files + len(files), total + size
        lines.append(f"{part:<10} {len(files):>6} {size / 2**20:>7.1f} {EXPECTED_S[part]:>11}")
    checkout = _checkout_mib()
    carried = total / 2**20 + RUNTIME_BUNDLE_MIB + (checkout or 0)
    lines.append(f"{'total':<10} {total_files:>6} {total / 2**20:>7.1f} {sum(EXPECTED_S[p] for p in parts):>11}")
    with_checkout = f" and the checkout's tracked files ({checkout:.1f} MiB)" if checkout else ""
    lines.append(f"carried with the runtime bundle (~{RUNTIME_BUNDLE_MIB:.0f} MiB){with_checkout}: {carried:.1f} of "
                 f"{CARRY_LIMIT_MIB} MiB" + ("  TOO LARGE to carry at once" if carried > CARRY_LIMIT_MIB else
                                             "  (close to the limit: the largest part can go in a campaign of its "
                                             "own)" if carried > 0.9 * CARRY_LIMIT_MIB else ""))
    return "\n".join(lines), carried


def too_large(out_dir: Path, carried: float):
    """One line when ``carried`` MiB exceed what one carry holds, else None."""
    if carried <= CARRY_LIMIT_MIB:
        return None
    return (f"{out_dir}: {carried:.1f} MiB carried with the runtime bundle and the checkout, over the "
            f"{CARRY_LIMIT_MIB} MiB one carry holds: build its parts into two campaigns (--parts) and carry each alone")


def _checkout_mib():
    """MiB of the checkout's tracked files (they travel with the campaign), or None where git cannot say."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True,
                               timeout=30).stdout.split(b"\0")
    except (OSError, subprocess.SubprocessError):
        return None
    return sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file()) / 2**20


def run(in_dir: Path, parts, json_out: Path, budget_s: float = RUN_BUDGET_S) -> int:
    from .device import run_device
    from .numerics import TORCH_DEVICE, torch_time

    manifest = json.loads((in_dir / "campaign.json").read_text())
    parts = [p for p in (parts or list(manifest["parts"])) if p in manifest["parts"]]
    for p in parts:
        print(f"part {p}: expected {manifest['parts'][p]['expected_s']} s", flush=True)
    dev, torch_device, name = run_device(manifest["arch"])
    TORCH_DEVICE[0] = torch_device
    import tvm

    results = {"device": name, "arch": manifest["arch"], "tvm": tvm.__version__, "parts": {}, "skipped": {}}
    began = time.time()
    took = sum(carry.unpack(in_dir / p) for p in parts)
    print(f"libraries unpacked in {took:.1f} s", flush=True)
    failed = 0
    for part in parts:
        start = time.time()
        expected = manifest["parts"][part]["expected_s"]
        if start - began + expected > budget_s:  # skipped whole: a part cut halfway leaves no rows
            results["skipped"][part] = {"expected_s": expected, "left_s": round(budget_s - (start - began), 1)}
            print(f"part {part}: skipped, expected {expected} s with {budget_s - (start - began):.0f} s of the "
                  f"{budget_s:.0f} s budget left", flush=True)
            json_out.write_text(json.dumps(results, indent=1))
            continue
        if part == "numerics":
            from . import numerics

            failed += numerics.run(in_dir / part, in_dir / part / "numerics.json")
            results["parts"][part] = json.loads((in_dir / part / "numerics.json").read_text())
        elif part == "e2e":
            rows = e2e.run(in_dir / part, dev, torch_device, torch_time)
            failed += sum(not r.get("ok", False) for r in rows)
            results["parts"][part] = {"cases": rows}
        elif part == "pool":
            rows = pool.run(in_dir / part, dev, torch_device)
            results["parts"][part] = {"cases": rows}  # a candidate that fails is a pool entry, not a failure
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
        if part == "pool":  # a row per task: its candidates' count and the best and the template default's times
            for line in _pool_lines(data.get("cases", [])):
                lines.append(f"{part:<10} {line}")
            lines.append(f"{part:<10} took {data.get('took_s', 0)} s")
            continue
        for row in data.get("cases", []):
            check = ("ok" if row.get("ok") else "FAIL") if "ok" in row else ("ERR" if "error" in row else "")
            ms = lambda k: f"{row[k] * 1e3:9.3f}" if k in row else f"{'':>9}"  # noqa: E731
            ratio = f"{row['ours_over_torch']:10.2f}" if "ours_over_torch" in row else f"{'':>10}"
            lines.append(f"{part:<10} {row['name'][:44]:<44} {check:<6} {ms('ours_s')} {ms('torch_s')} {ratio}")
        lines.append(f"{part:<10} took {data.get('took_s', 0)} s")
    skipped = results.get("skipped") or {}
    if skipped:
        lines.append(f"skipped for the time budget: {', '.join(skipped)}; run them in a second call: "
                     f"... run DIR --parts {','.join(skipped)}")
    return "\n".join(lines)


def _pool_lines(rows):
    tasks = {}
    for row in rows:
        tasks.setdefault(row["task"], []).append(row)
    for task, cands in tasks.items():
        timed = [r["ours_s"] for r in cands if "ours_s" in r]
        default = next((r.get("ours_s") for r in cands if r["id"] == 0), None)
        best = f"best {min(timed) * 1e3:.3f} ms" if timed else "none timed"
        first = f", the template's default {default * 1e3:.3f} ms" if default else ""
        yield f"{task:<30} {len(timed)}/{len(cands)} timed, {best}{first}"


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
    r.add_argument("--budget", type=float, default=RUN_BUDGET_S,
                   help=f"seconds for all parts (default {RUN_BUDGET_S}: a device call ends at 600); a part whose "
                        "expected time no longer fits is skipped and named for a second call")
    k = sub.add_parser("pool-pack", help="here, after a run: the pool part's times as pool files "
                                         "(tuning_lab replay --pools OUT) and record directories (--warm-start)")
    k.add_argument("dir", help="the campaign directory the run used")
    k.add_argument("results", help="the run's JSON")
    k.add_argument("out", help="where to write OUT/<task>-template.npz and OUT/records/<task>-template")
    args = ap.parse_args(argv)
    if args.mode == "pool-pack":
        from ...errors import FusionExtError

        try:
            for line in pool.pack(Path(args.dir), Path(args.results), Path(args.out)):
                print(line)
        except FusionExtError as e:
            raise SystemExit(str(e)) from None
        return 0
    if args.mode == "build":
        carried = build(Path(args.dir), args.arch, _parts(args.parts), args.quick)
        message = too_large(Path(args.dir), carried)
        if message:
            print(message, file=sys.stderr)
            return 1
        return 0
    in_dir = Path(args.dir)
    if not (in_dir / "campaign.json").is_file():
        raise SystemExit(f"{in_dir}: no campaign.json (build it first: ... build {in_dir} --arch sm_90)")
    return run(in_dir, _parts(args.parts) if args.parts else None, Path(args.json), args.budget)


if __name__ == "__main__":
    sys.exit(main())
