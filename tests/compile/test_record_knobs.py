"""Tuning records reach symbolic kernels: a template-space record of a static kernel gives its knobs to
the symbolic kernel of the same signature when the symbolic model is compiled with ``logs``.

Records are written directly (the template applied with chosen, non-default knobs and its trace committed to a
JSONDatabase, as the tuner commits one), so what must transfer is known; one test goes through the real tuner."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import tvm
from tvm import s_tir

from tvm_fusion_ext.schedules.cpu.dense import default_mr, symbolic_mr
from tvm_fusion_ext.targets import resolve_target

K, N = 32, 64
#: non-default knobs (symbolic defaults: mr 4, k [1, 32], unroll index 1): the static row split [ip, i0, mr]
#: gives mr 2
DENSE_KNOBS = {"k": [2, 16], "i": [1, 8, 2], "unroll": 2}
DENSE_TRANSFERRED = {"k": [2, 16], "unroll": 2, "mr": 2}
LAYERNORM_KNOBS = {"unroll": 2}
STATIC = {"x": [1, 16, K]}
_erf = np.vectorize(math.erf)


def _weights(k=K, n=N):
    rng = np.random.default_rng(0)
    return {"W1": (rng.standard_normal((k, n)) / math.sqrt(k)).astype("float32"),
            "b1": rng.standard_normal(n).astype("float32"),
            "W2": (rng.standard_normal((n, k)) / math.sqrt(n)).astype("float32"),
            "b2": rng.standard_normal(k).astype("float32"),
            "g": rng.standard_normal(k).astype("float32"), "be": rng.standard_normal(k).astype("float32")}


def _onnx(path, k=K, n=N, act="Gelu"):
    """``y = LayerNorm(act(x W1 + b1) W2 + b2 + x)`` for ``x: float32[batch, seq, k]``: a dense + activation, a
    plain dense and a residual LayerNorm, each a template kernel."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(v, name) for name, v in _weights(k, n).items()]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node(act, ["hb"], ["a"]), helper.make_node("MatMul", ["a", "W2"], ["h2"]),
             helper.make_node("Add", ["h2", "b2"], ["h2b"]), helper.make_node("Add", ["h2b", "x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "g", "be"], ["y"], axis=-1, epsilon=1e-5)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", k])
    graph = helper.make_graph(nodes, "knobs", [x], [y], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9), str(path))
    return str(path)


def _reference(x):
    w = {name: v.astype("float64") for name, v in _weights().items()}
    h = x.astype("float64") @ w["W1"] + w["b1"]
    h = 0.5 * h * (1 + _erf(h / math.sqrt(2)))
    r = h @ w["W2"] + w["b2"] + x
    mu = r.mean(-1, keepdims=True)
    return (r - mu) / np.sqrt(((r - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w["g"] + w["be"]


def _kernels(lowered, rule):
    from tvm_fusion_ext.schedules.rule import block_rule_of

    return {gv.name_hint: f for gv, f in lowered.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and block_rule_of(f) == rule}


def _gelu_dense(lowered):
    (func,) = [f for f in _kernels(lowered, "tfx.dense").values() if '"gelu"' in str(f.attrs["tfx.params"])]
    return func


def _record_dir(root, name="static", target="llvm"):
    from tvm_fusion_ext.records import target_label
    from tvm_fusion_ext.targets import resolve_target

    return os.path.join(str(root), f"{name}-{target_label(resolve_target(target))}")


def _commit(directory, func, trace, secs=1e-5, manifest=None, target="llvm"):
    """One tuning record of ``func`` with ``trace``, as the tuner commits one."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion_ext.records import open_database, target_label, write_manifest
    from tvm_fusion_ext.targets import resolve_target

    target = resolve_target(target)
    db = open_database(directory, create=True)
    workload = db.commit_workload(tvm.IRModule({"main": func}))
    db.commit_tuning_record(ms.database.TuningRecord(trace, workload, [secs], target, None))
    write_manifest(directory, {"target": target_label(target), "model_hash": "0" * 16, "trials": 1,
                               **(manifest or {})})


def _template_trace(func, rule, knobs, extra_sample=False, target="llvm"):
    from tvm_fusion_ext.schedules.registry import get_template
    from tvm_fusion_ext.targets import resolve_target

    target = resolve_target(target)
    template = get_template(rule, target)
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    template(sch, template.find_block(sch), target, knobs)
    if extra_sample:  # a knob the template does not read: the names cannot be zipped with the decisions
        sch.sample_categorical([0, 1], [0.5, 0.5], decision=1)
    return sch.trace


def _stale_trace(func):
    """A record of another version of the LayerNorm template: one categorical, over other candidates."""
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    sch.sample_categorical([0, 16, 64, 256], [0.25] * 4, decision=3)
    return sch.trace


def _auto_trace(func):
    """What an auto-space trace starts with (the driver's custom rule removes our annotation), then a sample."""
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    from tvm_fusion_ext.schedules.rule import root_blocks

    for block in root_blocks(sch):
        if "schedule_rule" in sch.get(block).annotations:
            sch.unannotate(block, "schedule_rule")
    sch.sample_categorical([0, 16, 64], [1 / 3] * 3, decision=2)
    return sch.trace


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return _onnx(tmp_path_factory.mktemp("knobs") / "model.onnx")


@pytest.fixture(scope="module")
def static_lowered(model):
    from tvm_fusion_ext.compile import prepare
    from tvm_fusion_ext.frontend import load_onnx

    return prepare(load_onnx(model, shapes=STATIC), "llvm")[0]


@pytest.fixture(scope="module")
def logs(tmp_path_factory, static_lowered):
    """A record directory of the static model: the GELU dense and the LayerNorm tuned to non-default knobs."""
    root = tmp_path_factory.mktemp("logs")
    directory = _record_dir(root)
    _commit(directory, _gelu_dense(static_lowered), _template_trace(_gelu_dense(static_lowered), "tfx.dense",
                                                                    DENSE_KNOBS))
    (ln,) = _kernels(static_lowered, "tfx.layernorm").values()
    _commit(directory, ln, _template_trace(ln, "tfx.layernorm", LAYERNORM_KNOBS))
    return str(root)


@pytest.fixture(scope="module")
def symbolic(model):
    from tvm_fusion_ext.frontend import load_onnx

    return load_onnx(model)


def test_signature_is_shared_by_static_and_symbolic_kernels_only(model, static_lowered, tmp_path):
    from tvm_fusion_ext.compile import prepare
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.schedules.kernel_knobs import kernel_signature

    def signatures(path, shapes=None):
        lowered = prepare(load_onnx(path, shapes=shapes), "llvm")[0]
        return {rule: sorted(kernel_signature(f) for f in _kernels(lowered, rule).values())
                for rule in ("tfx.dense", "tfx.layernorm")}

    static = {rule: sorted(kernel_signature(f) for f in _kernels(static_lowered, rule).values())
              for rule in ("tfx.dense", "tfx.layernorm")}
    assert len(set(static["tfx.dense"])) == 2  # the GELU dense (K 32 → N 64) and the plain one (64 → 32)
    assert signatures(model) == static  # symbolic rows, row_block: the same signatures
    assert signatures(model, {"x": [3, 5, K]}) == static  # other static rows
    relu = signatures(_onnx(tmp_path / "relu.onnx", act="Relu"))
    assert relu["tfx.layernorm"] == static["tfx.layernorm"]
    assert not set(relu["tfx.dense"]) & {s for s in static["tfx.dense"] if "gelu" in s}
    wider = signatures(_onnx(tmp_path / "wider.onnx", n=48))
    assert not set(wider["tfx.dense"]) & set(static["tfx.dense"])
    deeper = signatures(_onnx(tmp_path / "deeper.onnx", k=48))
    assert not set(deeper["tfx.dense"]) & set(static["tfx.dense"])
    assert not set(deeper["tfx.layernorm"]) & set(static["tfx.layernorm"])


def test_symbolic_kernels_take_the_records_knobs(symbolic, logs):
    from tvm_fusion_ext.compile import prepare
    from tvm_fusion_ext.compile.record_knobs import collect
    from tvm_fusion_ext.schedules.registry import get_template
    from tvm_fusion_ext.targets import resolve_target

    target = resolve_target("llvm")
    transfer = collect(logs, target)
    assert sorted(e.rule for e in transfer.table.by_signature.values()) == ["tfx.dense", "tfx.layernorm"]
    assert transfer.summary()["not_transferred"] == 0
    lowered = prepare(symbolic, target, kernel_knobs=transfer.table)[0]
    dense = _gelu_dense(lowered)
    # prepare time: the register tile's rows pad the run-time rows
    assert json.loads(str(dense.attrs["tfx.params"]))["row_block"] == DENSE_TRANSFERRED["mr"]
    plain = [f for f in _kernels(lowered, "tfx.dense").values() if '"gelu"' not in str(f.attrs["tfx.params"])]
    assert [json.loads(str(f.attrs["tfx.params"]))["row_block"] for f in plain] == [symbolic_mr(target)]  # default

    # schedule time: the template's samples take the record's decisions
    def decisions(func, rule, table):
        sch = get_template(rule, target).with_knobs(None, table).apply(func, target, False)
        return [(i.kind.name, tvm_value(sch.trace.decisions[i])) for i in sch.trace.insts
                if i.kind.name.startswith("Sample")]

    def tvm_value(v):
        try:
            return [int(x) for x in v]  # a perfect tile
        except TypeError:
            return int(v)  # a categorical index

    assert decisions(dense, "tfx.dense", transfer.table) == [("SamplePerfectTile", [2, 16]),
                                                             ("SampleCategorical", 2)]
    assert decisions(dense, "tfx.dense", None) == [("SamplePerfectTile", [1, 32]), ("SampleCategorical", 1)]
    (ln,) = _kernels(lowered, "tfx.layernorm").values()
    assert decisions(ln, "tfx.layernorm", transfer.table) == [("SampleCategorical", 2)]


def test_compile_lists_transferred_knobs_and_matches_untuned_and_numpy(model, symbolic, logs, tmp_path):
    from tvm_fusion_ext.compile import compile_artifact
    from tvm_fusion_ext.deploy import load

    manifest = compile_artifact(model, str(tmp_path / "tuned"), logs=logs)
    records = manifest["records"]
    assert records["dir"] is None and "tuned knobs on 2 kernels" in records["note"]
    assert records["logs"] == os.path.abspath(logs)  # what `bench`'s in-process peers compile with
    assert records["not_transferred"] == 0
    by_rule = {e["rule"]: e for e in records["transferred"]}
    assert set(by_rule) == {"tfx.dense", "tfx.layernorm"}
    assert by_rule["tfx.dense"]["knobs"] == DENSE_TRANSFERRED and '"gelu"' in by_rule["tfx.dense"]["signature"]
    assert by_rule["tfx.layernorm"]["knobs"] == LAYERNORM_KNOBS
    assert all(e["from"] == _record_dir(logs) and e["kernels"] == 1 for e in records["transferred"])
    compile_artifact(model, str(tmp_path / "untuned"))
    tuned, untuned = load(str(tmp_path / "tuned")), load(str(tmp_path / "untuned"))
    assert "transferred" not in untuned.manifest["records"]  # no --logs
    for batch, seq in ((1, 1), (2, 7), (3, 16)):
        x = np.random.default_rng(seq).standard_normal((batch, seq, K)).astype("float32")
        got = tuned.run({"x": x})["y"]
        np.testing.assert_allclose(got, untuned.run({"x": x})["y"], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got, _reference(x), rtol=1e-4, atol=1e-4)


def test_records_of_another_signature_do_not_transfer(symbolic, tmp_path):
    """Records of a ReLU dense and of a wider model: same rules, other signatures; nothing reaches the kernels."""
    from tvm_fusion_ext.compile import compile_model, prepare
    from tvm_fusion_ext.frontend import load_onnx

    root = tmp_path / "logs"
    for name, path in (("relu", _onnx(tmp_path / "relu.onnx", act="Relu")),
                       ("wider", _onnx(tmp_path / "wider.onnx", n=48, k=48))):
        lowered = prepare(load_onnx(path, shapes={"x": [1, 16, 48 if name == "wider" else K]}), "llvm")[0]
        for func in _kernels(lowered, "tfx.dense").values():
            if name == "wider" or '"relu"' in str(func.attrs["tfx.params"]):
                _commit(_record_dir(root, name), func, _template_trace(func, "tfx.dense", {"unroll": 3}))
    compiled = compile_model(symbolic, "llvm", logs=str(root))
    assert compiled.transferred == []
    assert "tuned knobs on 0 kernels" in compiled.records_note and "building untuned" in compiled.records_note


def test_auto_space_and_stale_records_are_counted_not_guessed(symbolic, static_lowered, tmp_path):
    """An auto-space record (no knobs), a record with a sample the template does not make and one of another
    template version (a sample of another shape) are counted with their reasons, never read as knobs; the
    fastest record that names cleanly gives the kernel's knobs (the GELU dense), a kernel without one keeps the
    defaults (the LayerNorm), and the build is correct."""
    from tvm_fusion_ext.compile import compile_model

    directory = _record_dir(tmp_path / "logs")
    dense = _gelu_dense(static_lowered)
    (ln,) = _kernels(static_lowered, "tfx.layernorm").values()
    _commit(directory, dense, _auto_trace(dense), secs=1e-6)                       # fastest, but auto space
    _commit(directory, dense, _template_trace(dense, "tfx.dense", DENSE_KNOBS, extra_sample=True), secs=2e-6)
    _commit(directory, dense, _template_trace(dense, "tfx.dense", {"unroll": 3}), secs=3e-6)  # transfers
    _commit(directory, ln, _stale_trace(ln))
    compiled = compile_model(symbolic, "llvm", logs=str(tmp_path / "logs"))
    reasons = compiled.transfer_refusals["not_transferred_reasons"]
    assert compiled.transfer_refusals["not_transferred"] == 3
    assert reasons.get("auto space (no template knobs)") == 1
    assert sum(n for r, n in reasons.items() if "samples where the template makes" in r) == 1
    assert reasons.get("trace's sample 1 is a one of [0, 16, 64, 256] where the template's 'unroll' is a one of "
                       "[0, 16, 64] (stale or foreign)") == 1
    # a trace records every decision: the knobs not given are the static defaults (k [1, 32], mr at 16 rows: 4 on
    # AVX2, 8 on AVX-512)
    mr = default_mr(16, resolve_target("llvm"))
    assert [(e["rule"], e["knobs"]) for e in compiled.transferred] == [("tfx.dense", {"k": [1, 32], "unroll": 3,
                                                                                      "mr": mr})]
    x = np.random.default_rng(1).standard_normal((2, 5, K)).astype("float32")
    vm = tvm.relax.VirtualMachine(compiled.executable, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, _reference(x), rtol=1e-4, atol=1e-4)


# real MetaSchedule tuning (30 s): once, in the slow tier
@pytest.mark.slow
def test_real_tuner_records_transfer(model, symbolic, tmp_path):
    """Through MetaSchedule: the static model tuned for a few trials in the template space, then the symbolic
    model compiled with those logs: every template kernel takes the best record's knobs, none is refused."""
    from tvm_fusion_ext.compile import compile_model
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.tune.driver import TuneOptions, tune

    tune(load_onnx(model, shapes=STATIC), "llvm", logs=str(tmp_path), workload="static",
         options=TuneOptions(trials=6, progress=None, per_iter=2, population=16, space="template"))
    compiled = compile_model(symbolic, "llvm", logs=str(tmp_path))
    assert compiled.transfer_refusals["not_transferred_reasons"].keys() <= {"kernel without a template"}
    assert sorted(e["rule"] for e in compiled.transferred) == ["tfx.dense", "tfx.dense", "tfx.layernorm"]
    assert all(set(e["knobs"]) == {"k", "unroll", "mr"} for e in compiled.transferred if e["rule"] == "tfx.dense")
    x = np.random.default_rng(2).standard_normal((2, 9, K)).astype("float32")
    vm = tvm.relax.VirtualMachine(compiled.executable, tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), _reference(x), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------- attention

HEADS, HEAD_DIM = 4, 32
#: non-default attention knobs (defaults: query_tile 32 → index 5, qk/pv rows 4 → index 2, unroll 16 → index 1)
ATTENTION_KNOBS = {"query_tile": 3, "qk_rows": 1, "pv_rows": 0, "unroll": 2}


def _attention_module(batch, seq):
    """``fused_attention`` of q/k/v ``[batch, seq, 4, 32]`` with a key-padding mask; ``None`` dims symbolic."""
    from tvm import relax

    from tvm_fusion_ext.ops import call_op
    from tvm_fusion_ext.testing import build_module

    b = batch if batch is not None else tvm.tirx.Var("batch", "int64")
    s = seq if seq is not None else tvm.tirx.Var("seq", "int64")
    args = [relax.Var(n, relax.TensorType([b, s, HEADS, HEAD_DIM], "float32")) for n in ("q", "k", "v")]
    args.append(relax.Var("mask", relax.TensorType([b, 1, 1, s], "float32")))
    return build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip(("q", "k", "v", "mask"), args)),
                                                 {"scale": 0.125}))


def _attention_reference(q, k, v, mask):
    scores = np.einsum("bshd,bthd->bhst", q.astype("float64"), k) * 0.125 + mask
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhst,bthd->bshd", p / p.sum(-1, keepdims=True), v)


def test_attention_takes_every_knob_but_the_query_tile(tmp_path):
    """Static keys ≥ 128 use the symbolic kernel's 128-key block: the same signature. The micro-kernel knobs
    transfer; the query tile (symbolic rows are padded to it) keeps the symbolic default."""
    from tvm_fusion_ext.compile import compile_model, prepare
    from tvm_fusion_ext.compile.record_knobs import collect
    from tvm_fusion_ext.schedules.cpu.attention import QUERY_TILES, SYMBOLIC_QUERY_TILE
    from tvm_fusion_ext.schedules.kernel_knobs import kernel_signature
    from tvm_fusion_ext.schedules.registry import get_template
    from tvm_fusion_ext.targets import resolve_target

    target = resolve_target("llvm")
    (static,) = _kernels(prepare(_attention_module(1, 128), target, fuse_graph=False)[0], "tfx.attention").values()
    (short,) = _kernels(prepare(_attention_module(1, 16), target, fuse_graph=False)[0], "tfx.attention").values()
    _commit(_record_dir(tmp_path), static, _template_trace(static, "tfx.attention", ATTENTION_KNOBS))
    table = collect(str(tmp_path), target).table
    (entry,) = table.by_signature.values()
    assert "query_tile" not in entry.knobs and {k: entry.knobs[k] for k in ("qk_rows", "pv_rows", "unroll")} == \
        {"qk_rows": 1, "pv_rows": 0, "unroll": 2}
    assert kernel_signature(short) != entry.signature  # 16 keys: a 16-key block, other vector splits

    symbolic = _attention_module(None, None)
    (kernel,) = _kernels(prepare(symbolic, target, fuse_graph=False, kernel_knobs=table)[0],
                         "tfx.attention").values()
    assert json.loads(str(kernel.attrs["tfx.params"]))["query_block"] == SYMBOLIC_QUERY_TILE
    sch = get_template("tfx.attention", target).with_knobs(None, table).apply(kernel, target, False)
    categorical = [int(sch.trace.decisions[i]) for i in sch.trace.insts if i.kind.name == "SampleCategorical"]
    # query_tile, qk_rows, pv_rows, unroll, in the order the template samples them
    assert categorical == [QUERY_TILES.index(SYMBOLIC_QUERY_TILE), 1, 0, 2]

    compiled = compile_model(symbolic, target, fuse_graph=False, logs=str(tmp_path))
    assert [e["rule"] for e in compiled.transferred] == ["tfx.attention"]
    vm = tvm.relax.VirtualMachine(compiled.executable, tvm.cpu())
    for batch, seq in ((1, 5), (2, 37)):
        rng = np.random.default_rng(seq)
        q, k, v = (rng.standard_normal((batch, seq, HEADS, HEAD_DIM)).astype("float32") for _ in range(3))
        mask = np.where(rng.random((batch, 1, 1, seq)) < 0.25, -1e4, 0.0).astype("float32")
        mask[..., 0] = 0.0
        got = vm["main"](*[tvm.runtime.tensor(a) for a in (q, k, v, mask)]).numpy()
        np.testing.assert_allclose(got, _attention_reference(q, k, v, mask), rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # ~65 s; the plain attention's knobs are checked in the default tier above
def test_attention_reading_heads_in_place_takes_the_knobs_of_the_plain_one(tmp_path):
    """A record tuned on q/k/v ``[1, 128, 4, 32]`` reaches the symbolic kernel reading the same heads as ranges of
    one ``[batch, seq, 12, 32]`` tensor (transform/attention_qkv_heads.py): same loops, same signature."""
    from tvm import relax

    from tvm_fusion_ext.compile import compile_model, prepare
    from tvm_fusion_ext.compile.record_knobs import collect
    from tvm_fusion_ext.ops import call_op
    from tvm_fusion_ext.schedules.kernel_knobs import kernel_signature
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.testing import build_module

    target = resolve_target("llvm")
    (static,) = _kernels(prepare(_attention_module(1, 128), target, fuse_graph=False)[0], "tfx.attention").values()
    _commit(_record_dir(tmp_path), static, _template_trace(static, "tfx.attention", ATTENTION_KNOBS))
    b, s = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType([b, s, 3 * HEADS, HEAD_DIM], "float32"))
    mask = relax.Var("mask", relax.TensorType([b, 1, 1, s], "float32"))
    heads = {"heads": HEADS, "kv_heads": HEADS, "q_head_start": 0, "k_head_start": HEADS, "v_head_start": 2 * HEADS}
    module = build_module([x, mask], lambda bb: call_op(bb, "fused_attention", {"q": x, "k": x, "v": x,
                                                                               "mask": mask},
                                                        {"scale": 0.125, **heads}))
    (kernel,) = _kernels(prepare(module, target, fuse_graph=False)[0], "tfx.attention").values()
    (entry,) = collect(str(tmp_path), target).table.by_signature.values()
    assert kernel_signature(kernel) == entry.signature

    compiled = compile_model(module, target, fuse_graph=False, logs=str(tmp_path))
    assert [e["rule"] for e in compiled.transferred] == ["tfx.attention"]
    vm = tvm.relax.VirtualMachine(compiled.executable, tvm.cpu())
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((2, 37, 3 * HEADS, HEAD_DIM)).astype("float32")
    m = np.where(rng.random((2, 1, 1, 37)) < 0.25, -1e4, 0.0).astype("float32")
    m[..., 0] = 0.0
    got = vm["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(m)).numpy()
    want = _attention_reference(*(xs[:, :, i * HEADS:(i + 1) * HEADS] for i in range(3)), m)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_knobs_that_fail_on_the_symbolic_kernel_fall_back_to_its_defaults(symbolic):
    """Knobs that cannot schedule the kernel (an unroll index past the template's candidates, as a database from
    another template version could hold; MetaSchedule's own loader refuses such a trace, so the table is made by
    hand): the template warns, schedules the kernel with its defaults, and nothing claims the knobs."""
    from tvm_fusion_ext.compile import finalize, prepare, schedule
    from tvm_fusion_ext.schedules.kernel_knobs import KernelKnobs, TransferredKnobs, kernel_signature
    from tvm_fusion_ext.targets import resolve_target

    target = resolve_target("llvm")
    lowered = prepare(symbolic, target)[0]
    (ln,) = _kernels(lowered, "tfx.layernorm").values()
    table = KernelKnobs()
    table.add(TransferredKnobs("tfx.layernorm", kernel_signature(ln), {"unroll": 9}, "by hand"))
    with pytest.warns(UserWarning, match="knobs transferred from tuning records; using its default knobs"):
        scheduled = schedule(lowered, target, kernel_knobs=table)
    assert table.kernels == 0 and table.applied() == []
    (ln,) = _kernels(scheduled, "tfx.layernorm").values()
    assert "pragma_auto_unroll_max_step" in ln.script()  # the template's schedule, not the fallback's
    x = np.random.default_rng(3).standard_normal((1, 3, K)).astype("float32")
    vm = tvm.relax.VirtualMachine(finalize(scheduled, target), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), _reference(x), rtol=1e-4, atol=1e-4)


def test_compile_command_says_how_many_kernels_took_tuned_knobs(model, logs, tmp_path, capsys):
    from tvm_fusion_ext.cli import main

    assert main(["compile", model, "-o", str(tmp_path / "art"), "--logs", logs]) == 0
    out = capsys.readouterr().out
    assert "tuned knobs: 2 kernels took knobs transferred from records of the same signature" in out
    assert main(["compile", model, "-o", str(tmp_path / "plain")]) == 0
    assert "tuned knobs" not in capsys.readouterr().out  # no --logs: nothing to say


def test_gated_dense_takes_k_unroll_and_the_register_tile_rows(tmp_path):
    """The gated dense samples its row split first (static rows only), then k and unroll: named by the template,
    not by position."""
    from tvm import relax

    from tvm_fusion_ext.compile import compile_model, prepare
    from tvm_fusion_ext.compile.record_knobs import collect
    from tvm_fusion_ext.ops import call_op
    from tvm_fusion_ext.schedules.registry import get_template
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.testing import build_module

    target = resolve_target("llvm")
    w = np.random.default_rng(4).standard_normal((K, 24, 2)).astype("float32") / math.sqrt(K)

    def module(batch, seq):
        b = batch if batch is not None else tvm.tirx.Var("batch", "int64")
        s = seq if seq is not None else tvm.tirx.Var("seq", "int64")
        x = relax.Var("x", relax.TensorType([b, s, K], "float32"))
        return build_module([x], lambda bb: call_op(bb, "fused_gated_dense", {"x": x, "w": relax.const(w)},
                                                    {"act": "silu"}))

    (static,) = _kernels(prepare(module(1, 16), target, fuse_graph=False)[0], "tfx.gated_dense").values()
    _commit(_record_dir(tmp_path), static, _template_trace(static, "tfx.gated_dense", DENSE_KNOBS))
    table = collect(str(tmp_path), target).table
    assert [e.knobs for e in table.by_signature.values()] == [DENSE_TRANSFERRED]
    symbolic = module(None, None)
    (kernel,) = _kernels(prepare(symbolic, target, fuse_graph=False, kernel_knobs=table)[0],
                         "tfx.gated_dense").values()
    assert json.loads(str(kernel.attrs["tfx.params"]))["row_block"] == DENSE_TRANSFERRED["mr"]
    sch = get_template("tfx.gated_dense", target).with_knobs(None, table).apply(kernel, target, False)
    samples = [sch.trace.decisions[i] for i in sch.trace.insts if i.kind.name.startswith("Sample")]
    assert [int(v) for v in samples[0]] == [2, 16] and int(samples[1]) == 2

    compiled = compile_model(symbolic, target, fuse_graph=False, logs=str(tmp_path))
    assert [e["rule"] for e in compiled.transferred] == ["tfx.gated_dense"]
    x = np.random.default_rng(5).standard_normal((2, 7, K)).astype("float32")
    gate, up = x.astype("float64") @ w[..., 0], x.astype("float64") @ w[..., 1]
    want = gate / (1 + np.exp(-gate)) * up
    vm = tvm.relax.VirtualMachine(compiled.executable, tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-4)


def test_cuda_layernorm_takes_threads_and_unroll(tmp_path, monkeypatch):
    """CUDA (compiled with nvcc, not run): the LayerNorm's thread count follows the row width, so a record's
    ``threads`` and ``unroll`` reach the symbolic kernel. Rows of 256: 64 float4 vectors, 32 or 64 threads
    (default 64, index 1)."""
    from tvm_fusion_ext.compile import compile_model, prepare
    from tvm_fusion_ext.compile.record_knobs import collect
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.schedules.registry import get_template
    from tvm_fusion_ext.targets import resolve_target

    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", os.environ.get("TVM_CUDA_COMPILE_MODE", "nvcc"))
    target = resolve_target("cuda:sm_90")
    model = _onnx(tmp_path / "wide.onnx", k=256)
    static = prepare(load_onnx(model, shapes={"x": [1, 16, 256]}), target)[0]
    (ln,) = _kernels(static, "tfx.layernorm").values()
    directory = _record_dir(tmp_path / "logs", target="cuda:sm_90")
    _commit(directory, ln, _template_trace(ln, "tfx.layernorm", {"threads": 0, "unroll": 2}, target="cuda:sm_90"),
            target="cuda:sm_90")
    transfer = collect(str(tmp_path / "logs"), target)
    assert [(e.rule, e.knobs) for e in transfer.table.by_signature.values()] == \
        [("tfx.layernorm", {"threads": 0, "unroll": 2})]
    assert collect(str(tmp_path / "logs"), resolve_target("llvm")).directories == []  # records of another target

    symbolic = load_onnx(model)
    (kernel,) = _kernels(prepare(symbolic, target)[0], "tfx.layernorm").values()

    def decisions(table):
        sch = get_template("tfx.layernorm", target).with_knobs(None, table).apply(kernel, target, False)
        return [int(sch.trace.decisions[i]) for i in sch.trace.insts if i.kind.name == "SampleCategorical"]

    assert decisions(transfer.table) == [0, 2] and decisions(None) == [1, 1]
    compiled = compile_model(symbolic, target, logs=str(tmp_path / "logs"))
    assert [(e["rule"], e["kernels"]) for e in compiled.transferred] == [("tfx.layernorm", 1)]


def test_cuda_simt_dense_knobs_reach_symbolic_rows(tmp_path, monkeypatch):
    """CUDA (nvcc, not run): a static fp32 dense is SIMT, as every symbolic dense is. Its column split, K split,
    vector width and unroll transfer as they are; its thread-row tile ``ty × yi`` becomes the operator's
    ``row_block``, so the padded rows split into whole tiles. A tensor-core record (fp16 in 16-multiples, tiles
    counted in 16 elements) transfers nothing, with its reason."""
    from tvm import relax

    from tvm_fusion_ext.compile import compile_model, prepare
    from tvm_fusion_ext.compile.record_knobs import collect
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.ops import call_op
    from tvm_fusion_ext.schedules.registry import get_template
    from tvm_fusion_ext.testing import build_module
    from tvm_fusion_ext.targets import resolve_target

    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", os.environ.get("TVM_CUDA_COMPILE_MODE", "nvcc"))
    target = resolve_target("cuda:sm_90")
    model = _onnx(tmp_path / "m.onnx", k=256)
    static = prepare(load_onnx(model, shapes={"x": [1, 64, 256]}), target)[0]
    dense = _gelu_dense(static)  # 64 x 256 -> 64
    knobs = {"i": [4, 4, 4], "j": [1, 16, 4], "k": [32, 8], "vec": 1, "unroll": 3}
    directory = _record_dir(tmp_path / "logs", target="cuda:sm_90")
    _commit(directory, dense, _template_trace(dense, "tfx.dense", knobs, target="cuda:sm_90"), target="cuda:sm_90")

    # an fp16 dense in 16-multiples: the tensor-core path, another signature (dtype), nothing to transfer
    w = np.random.default_rng(0).standard_normal((256, 64)).astype("float16")
    x = relax.Var("x", relax.TensorType([1, 64, 256], "float16"))
    half = prepare(build_module([x], lambda bb: call_op(bb, "fused_dense", {"x": x, "w": relax.const(w)},
                                                        {"act": "none"})), target, fuse_graph=False)[0]
    (mma,) = _kernels(half, "tfx.dense").values()
    _commit(_record_dir(tmp_path / "logs", "half", target="cuda:sm_90"), mma,
            _template_trace(mma, "tfx.dense", {}, target="cuda:sm_90"), target="cuda:sm_90")

    transfer = collect(str(tmp_path / "logs"), target)
    want = {"i": [1, 4, 4], "row_block": 16, "j": [1, 16, 4], "k": [32, 8], "vec": 1, "unroll": 3}
    assert [(e.rule, e.knobs) for e in transfer.table.by_signature.values()] == [("tfx.dense", want)]
    assert transfer.summary()["not_transferred_reasons"] == {
        "tfx.dense (cuda): no knob of the record keeps its meaning on run-time rows": 1}

    symbolic = load_onnx(model)
    (kernel,) = [f for f in _kernels(prepare(symbolic, target, kernel_knobs=transfer.table)[0], "tfx.dense").values()
                 if '"gelu"' in str(f.attrs["tfx.params"])]
    assert json.loads(str(kernel.attrs["tfx.params"]))["row_block"] == 16
    sch = get_template("tfx.dense", target).with_knobs(None, transfer.table).apply(kernel, target, False)
    samples = [sch.trace.decisions[i] for i in sch.trace.insts if i.kind.name.startswith("Sample")]
    assert [[int(v) for v in samples[0]], [int(v) for v in samples[1]], int(samples[2]), int(samples[3])] == \
        [[1, 16, 4], [32, 8], 1, 3]
    compiled = compile_model(symbolic, target, logs=str(tmp_path / "logs"))
    assert [(e["rule"], e["kernels"]) for e in compiled.transferred] == [("tfx.dense", 1)]