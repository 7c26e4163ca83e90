"""The campaign's ``pool`` part: a tuning pool measured on the GPU.

Build side (here): for each heavy kernel (the tuning lab's pool tasks ``bert-ffn``, dense 128×768×3072 + GELU,
and ``bert-attention``, seq 128, 12 heads of 64), the template's own candidate and random draws of its design
space (the lab's ``Sampler``: the tuner's postprocessors, distinct modules only) up to ``N`` per task, each with
its trace, MetaSchedule's features and the expert rules' verdict in a collection journal
(``work/<task>-template/candidates.jsonl``, the lab's format, no times yet), each compiled alone (one that fails
is recorded as a build error), and those that build compiled together into one library ``<task>.so``
(functions ``candidate_<id>``): a CUDA library is compiled by nvcc as it loads there, so one library per task
costs one nvcc run instead of one per candidate.

Run side (there): every library timed with ``time_evaluator`` on inputs made there; one row per candidate.

Back here: :func:`pack` (``python -m tvm_fusion_ext.tools.gpu_campaign pool-pack DIR RESULTS.json OUT``) puts the
times into the journals and writes, per task, the pool file ``OUT/<task>-template.npz`` (``tuning_lab replay
--pools OUT``) and the record directory ``OUT/records/<task>-template`` (``tvm-fusion tune --warm-start``;
``tvm-fusion compile --logs`` takes their knobs for kernels of the same signature).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List

import numpy as np

#: (pool task, candidates per task) of the full part, and of the CPU rehearsal's
TASKS = (("bert-ffn", 16), ("bert-attention", 16))
QUICK_TASKS = (("tiny-dense", 4),)
SPACE = "template"
#: seconds the full part is expected to take there: two libraries loaded (each compiled by nvcc as it loads,
#: 16 kernels: ~8 s) and 32 candidates timed (~0.2 s each)
EXPECTED_S = 25


def build(out_dir: Path, target, quick: bool = False) -> List[dict]:
    """Candidates of each task drawn, compiled to ``out_dir/<task>/<id>.so`` and journaled; an index for the run."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion_ext.records import target_label
    from tvm_fusion_ext.tools.tuning_lab.collect import (Journal, Sampler, _features, expert_verdict,
                                                         prepare_task, work_dir)
    from tvm_fusion_ext.tune.expert import check
    from tvm_fusion_ext.tune.intrin_stub import stub_tensor_intrinsics
    from tvm_fusion_ext.tune.knob_features import trace_json

    out_dir.mkdir(parents=True, exist_ok=True)
    index = []
    for task_name, count in (QUICK_TASKS if quick else TASKS):
        start = time.time()
        with stub_tensor_intrinsics(True):
            task = prepare_task(task_name, SPACE, target)
            sampler = Sampler(task, target, set())
            rng = np.random.default_rng([1, 0])
            drawn, misses = [], 0
            first = sampler.default()
            if first is not None:
                drawn.append((*first, "default"))
            while len(drawn) < count and misses < 200:
                got = sampler.random(rng)
                if got is None:
                    misses += 1
                    continue
                misses = 0
                drawn.append((*got, "random"))
            feats = _features(sampler.context, [sch for sch, _, _ in drawn])
        work = Path(work_dir(str(out_dir / "work"), task_name, SPACE))
        work.mkdir(parents=True, exist_ok=True)
        meta = {"task": task_name, "space": SPACE, "kernel": task.name, "flops": task.flops,
                "target": str(target), "target_label": target_label(target), "tvm": tvm.__version__, "seed": 1,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "measurement": "the GPU campaign's pool part: time_evaluator(number=N, repeat=3) on the GPU",
                "sampling": {"random_first": count, "mutation_share": 0.0, "parents": 0}}
        (work / "meta.json").write_text(json.dumps(meta, indent=1))
        journal = Journal(str(work))
        built = {}
        for i, ((sch, key, origin), feat) in enumerate(zip(drawn, feats)):
            rec = {"id": i, "hash": key, "origin": origin, "parent": None, "expert_rule": expert_verdict(check, sch, target),
                   "trace": trace_json(sch.trace), "features": feat, "build_error": None, "run_error": None,
                   "run_secs": None}
            entry = {"task": task_name, "id": i, "flops": task.flops}
            try:
                with target:
                    tvm.compile(sch.mod, target)  # alone first: one that does not build is a pool entry
                args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
                entry.update(library=f"{task_name}.so", function=f"candidate_{i}",
                             args=[[[int(d) for d in a.shape], str(a.dtype)] for a in args])
                built[f"candidate_{i}"] = _entry_func(sch.mod)
            except Exception as e:  # noqa: BLE001  (a candidate that does not build is a pool entry too)
                rec["build_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e) else ''}"
            journal.append(rec)
            index.append(entry)
        if built:  # one library per task: a CUDA library is compiled by nvcc as it loads there, once per library
            module = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in built.items()})
            with target:
                tvm.compile(module, target).export_library(str(out_dir / f"{task_name}.so"))
        print(f"built pool/{task_name}: {len(drawn)} candidates ({time.time() - start:.0f} s)", flush=True)
    (out_dir / "pool.json").write_text(json.dumps({"part": "pool", "candidates": index}, indent=1))
    return index


def _entry_func(mod):
    import tvm

    funcs = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    return funcs["main"] if "main" in funcs else next(iter(funcs.values()))


# -- run (there) ---------------------------------------------------------------------------------------------------
def run(in_dir: Path, tvm_dev, torch_device: str) -> List[dict]:
    """One row per candidate: ``run_secs`` (3 repeats) or its error."""
    import torch
    import tvm

    index = json.loads((in_dir / "pool.json").read_text())
    rows, libraries = [], {}
    for n, c in enumerate(index["candidates"]):
        row = {"name": f"pool_{c['task']}_{c['id']}", "task": c["task"], "id": c["id"]}
        if "library" not in c:
            row["error"] = "not built"
            rows.append(row)
            continue
        try:
            gen = torch.Generator(device=torch_device).manual_seed(n)
            args = [tvm.runtime.from_dlpack(
                (torch.randn(shape, generator=gen, device=torch_device) * 0.1).to(getattr(torch, dtype))
                if dtype.startswith(("float", "bfloat")) else torch.zeros(shape, dtype=getattr(torch, dtype),
                                                                          device=torch_device))
                for shape, dtype in c["args"]]
            if c["library"] not in libraries:
                libraries[c["library"]] = tvm.runtime.load_module(str(in_dir / c["library"]))
            lib = libraries[c["library"]]
            rate = 2e13 if torch_device == "cuda" else 2e10
            number = max(3, min(100, int(0.05 * rate / max(c["flops"], 1))))
            timer = lib.time_evaluator(c["function"], tvm_dev, number=number, repeat=3)
            row["run_secs"] = [float(s) for s in timer(*args).results]
            row["ours_s"] = min(row["run_secs"])
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        rows.append(row)
    best = {}
    for r in rows:
        if "ours_s" in r:
            best[r["task"]] = min(best.get(r["task"], float("inf")), r["ours_s"])
    for task, seconds in best.items():
        print(f"pool {task}: best of {sum(r['task'] == task for r in rows)} candidates {seconds * 1e6:.1f} us",
              flush=True)
    return rows


# -- back here: times into a pool file and records ---------------------------------------------------------------
def pack(campaign: Path, results: Path, out: Path) -> List[str]:
    """The run's ``pool`` rows (``results``: the campaign's JSON) into each task's journal under ``campaign/pool/
    work``, then ``out/<task>-template.npz`` and ``out/records/<task>-template``; one summary line per task."""
    import shutil

    from tvm_fusion_ext.errors import FusionExtError
    from tvm_fusion_ext.tools.tuning_lab.collect import read_records
    from tvm_fusion_ext.tools.tuning_lab.pool_file import pack as pack_pool
    from tvm_fusion_ext.tools.tuning_lab.pool_records import export_records

    data = json.loads(results.read_text())
    rows = (data.get("parts", {}).get("pool") or {}).get("cases")
    if not rows:
        raise FusionExtError(f"{results}: no pool part in these results")
    device = data.get("device", "")
    by_key = {(r["task"], r["id"]): r for r in rows}
    lines = []
    for work in sorted((campaign / "pool" / "work").iterdir()):
        records = read_records(str(work))
        meta = json.loads((work / "meta.json").read_text())
        staged = out / "work" / work.name
        if staged.exists():
            shutil.rmtree(staged)
        staged.mkdir(parents=True)
        with open(staged / "candidates.jsonl", "w", encoding="utf-8") as f:
            for rec in records:
                row = by_key.get((meta["task"], rec["id"]), {})
                if rec.get("build_error") is None:
                    rec["run_secs"] = row.get("run_secs")
                    rec["run_error"] = None if row.get("run_secs") else row.get("error", "not run")
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        meta["machine"] = {"gpu": device}
        (staged / "meta.json").write_text(json.dumps(meta, indent=1))
        pool_file = out / f"{work.name}.npz"
        lines.append(pack_pool(str(staged), str(pool_file)))
        record_dir = out / "records" / work.name
        if record_dir.exists():
            shutil.rmtree(record_dir)
        lines.append(export_records(str(pool_file), str(record_dir)))
    return lines
