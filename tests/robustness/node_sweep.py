"""ONNX's single-operator backend cases through ``tvm-fusion run``: each ends in a pass, a clean refusal or a failure.

Each case of ``onnx/backend/test/data/node/<case>/`` (``model.onnx``, ``test_data_set_0/input_*.pb`` and
``output_*.pb``) is written to an ``.npz`` and run through the real CLI path, ``tvm_fusion_ext.cli.main(["run",
...])``, in a worker process: a crash or an abort inside TVM kills the worker, not the sweep, and is recorded
against the case that was running. Outcomes:

``pass``      exit 0 and every output equal to ONNX's expected output (shape, dtype, values within
              :func:`tolerance`)
``refused``   exit 2 and exactly one line on stderr, ``error: ...``, nothing else printed to stderr
``failed``    anything else: ``internal`` (exit 1), ``wrong`` (a result that differs), ``crash`` (the worker died),
              ``timeout``, ``unclean`` (exit 2 with more than one line, or any other exit code)

The onnx wheel no longer ships the node data; when it is absent the cases are generated with onnx's own case
generators (``onnx.backend.test.case.node``, the code that wrote those files) into a cache directory, in the same
layout. Run as a script for the full sweep and its table (docs/coverage.md, "Operator coverage")::

    python tests/robustness/node_sweep.py --workers 2 --json node_sweep.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional

import numpy as np

#: seconds one case may take (import + fuse + build + run) before its worker is killed
CASE_TIMEOUT = 240
#: cases a worker runs before it is replaced (bounds whatever TVM leaks per build)
CASES_PER_WORKER = 150

FAILURE_KINDS = ("internal", "wrong", "crash", "timeout", "unclean")

#: cases that once failed (an internal error, a wrong answer or a crash), one or two per cause, run by the default
#: test next to the representative subset (which picks the first case of each op and would miss most of them)
REGRESSION_CASES = (
    "test_batchnorm_example_training_mode",            # training mode: refused, was a wrong answer
    "test_bitshift_left_int8_shift_ge_width",          # shifts past the width
    "test_bitshift_right_int8_negative_shift",
    "test_blackmanwindow_expanded",                    # data-dependent Range length used before FuseOps defined it
    "test_hannwindow_symmetric_expanded",
    "test_cast_FLOAT_to_FLOAT8E4M3FN",                 # types TVM cannot compute with: refused
    "test_cast_FLOAT_to_BFLOAT16",
    "test_constantofshape_int_shape_zero",             # shape given at run time
    "test_constantofshape_float_ones",
    "test_convtranspose_output_shape",                 # ignored attribute: refused
    "test_cosh_example",                               # cosh / sinh vectorised: no LLVM lowering
    "test_sinh_example",
    "test_dropout_default_mask",                       # the mask output
    "test_expand_dim_changed",                         # target dim 1 shrank the input's dim
    "test_if_seq",                                     # a sequence graph output: refused
    "test_isinf_negative",                             # detect_negative / detect_positive
    "test_layer_normalization_3d_axis1_epsilon",       # Mean / InvStdDev outputs
    "test_mod_float_edge_cases_fmod_0_float32",        # floor mod at infinities
    "test_nonmaxsuppression_suppress_by_IOU",          # thresholds at run time: refused; was a build failure
    "test_pow_types_int64_int64",                      # integer Pow
    "test_rms_normalization_3d_axis0_epsilon",         # RMSNorm over every axis
    "test_roialign_mode_max",                          # pools differently: refused
    "test_shape_start_1_end_negative_1",               # a Shape graph output
    "test_spacetodepth_crd_mode_example",              # CRD mode
    "test_split_to_sequence_nokeepdims",               # a sequence graph output: refused
    "test_training_dropout_mask",                      # training mode: refused
    # ONNX's Attention / RotaryEmbedding (frontend/converters/attention.py, rotary.py), once all refused
    "test_attention_4d_gqa_causal_nonpad_decode",      # grouped heads, causal from per-batch key counts
    "test_attention_3d_with_past_and_present_qk_matmul",  # 3-D, cache in front, present and scores outputs
    "test_attention_23_boolmask_fullymasked_row_nan_robustness_expanded",  # ReduceMax of -inf; Concat of sizes
    "test_rotary_embedding_with_interleaved_rotary_dim_expanded",         # Split sizes computed from sizes
    "test_rotary_embedding_3d_input",
)


@dataclass
class Result:
    case: str
    ops: List[str]
    outcome: str                  # pass | refused | failed
    kind: str = ""                # failed: one of FAILURE_KINDS; refused: reason class
    detail: str = ""              # the error line, or what differed
    seconds: float = 0.0


# ---------------------------------------------------------------------------------------------------------------
# the cases
# ---------------------------------------------------------------------------------------------------------------
def shipped_node_dir() -> Optional[str]:
    """onnx's ``backend/test/data/node`` when the installed wheel ships it."""
    import onnx

    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
    return path if os.path.isdir(path) and os.listdir(path) else None


def node_case_dir(cache_dir: str) -> str:
    """A directory of node cases in onnx's layout: the shipped one, else generated once into ``cache_dir``."""
    import onnx

    shipped = shipped_node_dir()
    if shipped is not None:
        return shipped
    # keyed by onnx's version (its generators define the cases); written aside and renamed, so that a run that
    # is interrupted, or two running at once, never leave a half-written directory behind for the next
    root = os.path.join(cache_dir, f"onnx-{onnx.__version__}", "node")
    if not os.path.isdir(root):
        os.makedirs(os.path.dirname(root), exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="node-", dir=os.path.dirname(root))
        generate_node_cases(scratch)
        try:
            os.rename(scratch, root)
        except OSError:  # another run got there first
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
    return root


def generate_node_cases(root: str) -> int:
    """Write every case of ``onnx.backend.test.case.node`` under ``root`` as onnx's generate-data tool does."""
    import warnings

    from onnx import numpy_helper
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        warnings.simplefilter("ignore")  # the generators overflow casts on purpose
        np_err = np.seterr(all="ignore")
        try:
            cases = node.collect_testcases(None)
        finally:
            np.seterr(**np_err)
    for case in cases:
        data_dir = os.path.join(root, case.name, "test_data_set_0")
        os.makedirs(data_dir, exist_ok=True)
        with open(os.path.join(root, case.name, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        inputs, outputs = case.data_sets[0]
        for prefix, infos, values in (("input", case.model.graph.input, inputs),
                                      ("output", case.model.graph.output, outputs)):
            for j, (info, value) in enumerate(zip(infos, values)):
                with open(os.path.join(data_dir, f"{prefix}_{j}.pb"), "wb") as f:
                    f.write(_to_proto(numpy_helper, info, value).SerializeToString())
    return len(cases)


def _to_proto(numpy_helper, info, value):
    from onnx import TensorProto

    if info.type.HasField("sequence_type"):
        return numpy_helper.from_list(value, info.name)
    if info.type.HasField("optional_type"):
        return numpy_helper.from_optional(value, info.name)
    if info.type.HasField("map_type"):
        return numpy_helper.from_dict(value, info.name)
    return value if isinstance(value, TensorProto) else numpy_helper.from_array(value, info.name)


def case_names(root: str) -> List[str]:
    return sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "model.onnx")))


def case_ops(root: str, name: str) -> List[str]:
    """Op types of the case's graph (subgraphs included), ``domain.Op`` outside the default domain."""
    import onnx

    model = onnx.load(os.path.join(root, name, "model.onnx"), load_external_data=False)
    ops = []

    def walk(graph):
        for n in graph.node:
            op = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            if op not in ops:
                ops.append(op)
            for a in n.attribute:
                if a.HasField("g"):
                    walk(a.g)
                for g in a.graphs:
                    walk(g)

    walk(model.graph)
    return ops


def representative_subset(root: str, names: Iterable[str]) -> List[str]:
    """Deterministic subset covering every op type at least once: for each op type, the first case by name whose
    graph is that op alone, else the first case that contains it."""
    names = list(names)
    ops_of = {n: case_ops(root, n) for n in names}
    chosen: List[str] = []
    for op in sorted({op for ops in ops_of.values() for op in ops}):
        single = [n for n in names if ops_of[n] == [op]]
        pick = single[0] if single else next(n for n in names if op in ops_of[n])
        if pick not in chosen:
            chosen.append(pick)
    return sorted(chosen)


def read_case(root: str, name: str):
    """``(model path, {input name: array} for tensor inputs, [(output name, expected array | None)])``.

    Non-tensor inputs (sequences, optionals) are left out of the feed: the CLI takes tensors only and must refuse
    such a model with one line; expected non-tensor outputs are ``None``."""
    import onnx
    from onnx import numpy_helper

    path = os.path.join(root, name, "model.onnx")
    model = onnx.load(path, load_external_data=False)
    data_dir = os.path.join(root, name, "test_data_set_0")
    init = {t.name for t in model.graph.initializer}
    feeds = {}
    for j, info in enumerate(i for i in model.graph.input if i.name not in init):
        pb = os.path.join(data_dir, f"input_{j}.pb")
        if info.type.HasField("tensor_type") and os.path.exists(pb):
            feeds[info.name] = _npz_safe(numpy_helper.to_array(_load_tensor(pb)))
    expected = []
    for j, info in enumerate(model.graph.output):
        pb = os.path.join(data_dir, f"output_{j}.pb")
        value = numpy_helper.to_array(_load_tensor(pb)) if info.type.HasField("tensor_type") else None
        expected.append((info.name, value))
    return path, feeds, expected


def _load_tensor(path):
    from onnx import TensorProto

    t = TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return t


def _npz_safe(a: np.ndarray) -> np.ndarray:
    # string tensors come back as object arrays of bytes, which np.savez could only pickle
    if a.dtype == object:
        return np.array([x.decode() if isinstance(x, bytes) else str(x) for x in a.reshape(-1)]).reshape(a.shape)
    return a


# ---------------------------------------------------------------------------------------------------------------
# judging one case
# ---------------------------------------------------------------------------------------------------------------
def tolerance(dtype: np.dtype):
    """``(rtol, atol)`` for comparing an output of ``dtype`` (atol scales with the output's magnitude)."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f" and dtype.kind != "c":
        return 0.0, 0.0
    if dtype.itemsize <= 2:
        return 1e-2, 1e-2
    if dtype.itemsize == 4:
        return 1e-3, 1e-5
    return 1e-6, 1e-9


def compare(name: str, got: Optional[np.ndarray], want: Optional[np.ndarray]) -> str:
    """Empty when ``got`` equals ``want``, else what differs (one line)."""
    if want is None:
        return f"output {name!r}: expected a non-tensor value, got a tensor"
    if got is None:
        return f"output {name!r} missing from the result"
    if got.shape != want.shape:
        return f"output {name!r}: shape {list(got.shape)} != expected {list(want.shape)}"
    if want.dtype == object or want.dtype.kind in "US":
        w = np.array([x.decode() if isinstance(x, bytes) else str(x) for x in want.reshape(-1)])
        return "" if np.array_equal(got.reshape(-1).astype(str), w) else f"output {name!r}: strings differ"
    if got.dtype != want.dtype:
        return f"output {name!r}: dtype {got.dtype} != expected {want.dtype}"
    if want.dtype.kind == "b" or want.dtype.kind in "iu":
        bad = got != want
        if bad.any():
            i = tuple(int(x) for x in np.argwhere(bad)[0])
            return f"output {name!r}: {int(bad.sum())} of {want.size} elements differ (at {list(i)}: {got[i]} != {want[i]})"
        return ""
    rtol, atol = tolerance(want.dtype)
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w)
    scale = max(1.0, float(np.abs(w[finite]).max())) if finite.any() else 1.0
    ok = np.isclose(g, w, rtol=rtol, atol=atol * scale, equal_nan=True)
    if ok.all():
        return ""
    i = tuple(int(x) for x in np.argwhere(~ok)[0])
    return (f"output {name!r}: {int((~ok).sum())} of {w.size} elements differ (at {list(i)}: {got[i]!r} != "
            f"{want[i]!r}; rtol {rtol:g}, atol {atol * scale:g})")


def classify(rc: int, stderr: str, outputs: Optional[Dict[str, np.ndarray]], expected) -> tuple:
    """``(outcome, kind, detail)`` for one CLI run."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if rc == 0:
        if outputs is None:
            return "failed", "wrong", "exit 0 but no output file"
        for name, want in expected:
            why = compare(name, outputs.get(name), want)
            if why:
                return "failed", "wrong", why
        return "pass", "", ""
    if rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "internal error" not in lines[0]:
        return "refused", refusal_reason(lines[0]), lines[0]
    if rc == 1:
        return "failed", "internal", next((ln for ln in lines if ln.startswith("error:")), " | ".join(lines[-3:]))
    return "failed", "unclean", f"exit {rc}: " + " | ".join(lines[:3])[:400]


#: (reason class, pattern of the error line), first match wins
_REASONS = [
    ("op not in TVM's ONNX importer", r"is not supported by TVM's ONNX importer"),
    ("non-tensor graph output", r"graph output .* not a tensor"),
    ("non-tensor graph input", r"is not a tensor"),
    ("element type TVM cannot import", r"element type|not a readable \.npz file \(descr is not a valid dtype"),
    ("zero-size input dim (dims are at least 1)", r"is 0, outside the range the model was compiled for"),
    ("unsupported attribute / opset combination", r"is not supported( here)?:|not supported for"),
    ("TVM converter failed", r"TVM cannot import node|TVM's ONNX importer failed"),
    ("build failed", r"cannot build"),
]


def refusal_reason(line: str) -> str:
    for reason, pattern in _REASONS:
        if re.search(pattern, line):
            return reason
    return "other: " + re.sub(r"'[^']*'", "'…'", line[len("error: "):])[:80]


# ---------------------------------------------------------------------------------------------------------------
# the worker: runs cases in this process, one JSON line per case on a private pipe
# ---------------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _captured_fds(out_path: str, err_path: str):
    """Point fds 1 and 2 (Python's and TVM's C++ output alike) at files for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(out_path, "w") as out, open(err_path, "w") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def run_case(root: str, name: str, work: str, extra_args=()) -> Result:
    """One case through ``tvm-fusion run`` in this process."""
    from tvm_fusion_ext.cli import main

    start = time.perf_counter()
    ops = case_ops(root, name)
    model, feeds, expected = read_case(root, name)
    inputs, output = os.path.join(work, "inputs.npz"), os.path.join(work, "outputs.npz")
    for p in (inputs, output):
        if os.path.exists(p):
            os.remove(p)
    np.savez(inputs, **feeds)
    out_log, err_log = os.path.join(work, "stdout.txt"), os.path.join(work, "stderr.txt")
    with _captured_fds(out_log, err_log):
        try:
            rc = main(["run", model, "--inputs", inputs, "--output", output, *extra_args])
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
        except BaseException as exc:  # noqa: BLE001  (cli.main must not let anything out; record it if it does)
            print(f"harness: cli.main raised {type(exc).__name__}: {exc}", file=sys.stderr)
            rc = -1
    with open(err_log) as f:
        stderr = f.read()
    outputs = None
    if rc == 0 and os.path.exists(output):
        with np.load(output, allow_pickle=False) as data:
            outputs = {k: data[k] for k in data.files}
    outcome, kind, detail = classify(rc, stderr, outputs, expected)
    return Result(name, ops, outcome, kind, detail, round(time.perf_counter() - start, 2))


def worker_main(root: str, channel_fd: int) -> None:
    """Read case names from stdin; for each, write ``start <name>`` and then the result's JSON to ``channel_fd``."""
    channel = os.fdopen(channel_fd, "w", buffering=1)
    with tempfile.TemporaryDirectory(prefix="node-sweep-") as work:
        for line in sys.stdin:
            name = line.strip()
            if not name:
                continue
            channel.write(f"start {name}\n")
            if name == os.environ.get("NODE_SWEEP_ABORT_CASE"):
                os.abort()  # for the harness's own test: a case that kills its worker
            result = run_case(root, name, work)
            channel.write("result " + json.dumps(asdict(result)) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# the sweep: workers in subprocesses, crashes and timeouts attributed to their case
# ---------------------------------------------------------------------------------------------------------------
class _Worker:
    def __init__(self, root: str, cases: List[str], env: dict):
        r, w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", root, "--channel",
                                      str(w)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, pass_fds=(w,), env=env, text=True)
        os.close(w)
        self.channel = r
        self.buffer = b""
        self.pending = list(cases)
        self.current: Optional[str] = None
        self.started = 0.0
        self.proc.stdin.write("".join(c + "\n" for c in cases))
        self.proc.stdin.close()

    def read_lines(self) -> Optional[List[str]]:
        """Complete lines received so far, or None at end of file (unbuffered: select() must see every byte)."""
        chunk = os.read(self.channel, 1 << 16)
        if not chunk:
            return None
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [ln.decode() for ln in lines]

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.channel)


def sweep(root: str, names: List[str], workers: int = 1, timeout: float = CASE_TIMEOUT,
          progress=None) -> List[Result]:
    """Run ``names`` in ``workers`` worker processes; results in ``names`` order."""
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TVM_NUM_THREADS", "1")  # workers share the machine; a one-op build is not worth more
    todo = collections.deque(names)
    results: Dict[str, Result] = {}
    active: List[_Worker] = []

    # an even share per worker when the cases are few (one worker each), else bounded batches
    per_worker = min(CASES_PER_WORKER, -(-len(names) // max(1, workers)))

    def spawn():
        batch = [todo.popleft() for _ in range(min(per_worker, len(todo)))]
        if batch:
            active.append(_Worker(root, batch, env))

    def record(res: Result):
        results[res.case] = res
        if progress is not None:
            progress(res, len(results), len(names))

    for _ in range(max(1, workers)):
        spawn()
    while active:
        ready, _, _ = select.select([w.channel for w in active], [], [], 1.0)
        for w in list(active):
            if w.channel in ready:
                lines = w.read_lines()
                for line in lines or []:
                    if line.startswith("start "):
                        w.current, w.started = line[len("start "):].strip(), time.monotonic()
                    elif line.startswith("result "):
                        record(Result(**json.loads(line[len("result "):])))
                        w.pending.remove(w.current)
                        w.current = None
                if lines is not None:
                    continue
                # end of file: the worker is gone; a case it was running crashed it
                w.proc.wait()
                if w.current is not None:
                    rc = w.proc.returncode
                    how = f"signal {-rc}" if rc < 0 else f"exit {rc}"
                    record(Result(w.current, case_ops(root, w.current), "failed", "crash",
                                  f"the process died ({how})", round(time.monotonic() - w.started, 2)))
                    w.pending.remove(w.current)
                todo.extendleft(reversed(w.pending))
                w.close()
                active.remove(w)
                spawn()
            elif w.current is not None and time.monotonic() - w.started > timeout:
                record(Result(w.current, case_ops(root, w.current), "failed", "timeout",
                              f"no result after {timeout:.0f} s", round(time.monotonic() - w.started, 2)))
                w.pending.remove(w.current)
                w.current = None
                todo.extendleft(reversed(w.pending))
                w.pending = []
                w.close()
                active.remove(w)
                spawn()
    return [results[n] for n in names]


# ---------------------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------------------
def summary(results: List[Result]) -> dict:
    counts = collections.Counter(r.outcome for r in results)
    reasons = collections.Counter(r.kind for r in results if r.outcome == "refused")
    failures = collections.Counter(r.kind for r in results if r.outcome == "failed")
    ops = collections.defaultdict(collections.Counter)
    for r in results:
        for op in r.ops:
            ops[op][r.outcome] += 1
    return {"cases": len(results), "outcomes": dict(counts), "refusal_reasons": dict(reasons.most_common()),
            "failure_kinds": dict(failures.most_common()),
            "ops": {op: dict(c) for op, c in sorted(ops.items())},
            "ops_fully_passing": sum(1 for c in ops.values() if set(c) == {"pass"}),
            "ops_with_failures": sorted(op for op, c in ops.items() if c.get("failed"))}


def markdown(results: List[Result]) -> str:
    s = summary(results)
    o = s["outcomes"]
    lines = ["| outcome | cases |", "|---|---|",
             f"| passed (equal to ONNX's expected output) | {o.get('pass', 0)} |",
             f"| refused with one `error:` line | {o.get('refused', 0)} |"]
    lines += [f"| &nbsp;&nbsp;{reason} | {n} |" for reason, n in s["refusal_reasons"].items()]
    lines += [f"| failed | {o.get('failed', 0)} |"]
    lines += [f"| &nbsp;&nbsp;{kind} | {n} |" for kind, n in s["failure_kinds"].items()]
    lines += [f"| **total** | {s['cases']} |"]
    return "\n".join(lines)


def ops_markdown(results: List[Result]) -> str:
    """One row per op type: the cases whose graph contains it, by outcome (a case refused for another of its ops
    counts as refused here too), and the commonest refusal that names this op."""
    ops = collections.defaultdict(collections.Counter)
    why: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        for op in r.ops:
            ops[op][r.outcome] += 1
            if r.outcome == "refused" and re.search(rf"\bop '?{re.escape(op)}\b", r.detail):
                why[op][_refusal_gist(r.detail)] += 1
    lines = ["| op | cases with it | passed | refused | failed | commonest refusal naming this op |",
             "|---|---|---|---|---|---|"]
    for op in sorted(ops):
        c = ops[op]
        reason = why[op].most_common(1)[0][0] if why[op] else ""
        lines.append(f"| {op} | {sum(c.values())} | {c.get('pass', 0)} | {c.get('refused', 0)} | "
                     f"{c.get('failed', 0)} | {reason} |")
    return "\n".join(lines)


def _refusal_gist(line: str) -> str:
    """The refusal without the file path and value names, short enough for a table cell."""
    text = line[len("error: "):] if line.startswith("error: ") else line
    text = re.sub(r"^\S+\.(onnx|npz): ", "", text)
    text = re.sub(r"\(node [^)]*\)|node (<unnamed, output '[^']*'>|'[^']*')", "(node …)", text)
    text = text.replace("|", "\\|")
    return text[:140] + ("…" if len(text) > 140 else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--channel", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "tfx-onnx-node-cases"),
                   help="where generated cases go when onnx does not ship them")
    p.add_argument("--subset", action="store_true", help="one case per op type (the default test's subset)")
    p.add_argument("--match", help="only cases whose name matches this regular expression")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=CASE_TIMEOUT)
    p.add_argument("--json", help="write every case's result and the summary here")
    p.add_argument("--ops-table", help="write the per-op table (markdown) here")
    p.add_argument("-v", "--verbose", action="store_true", help="print every case, not only failures")
    args = p.parse_args(argv)
    if args.worker:
        worker_main(args.worker, args.channel)
        return 0
    root = node_case_dir(args.cache)
    names = case_names(root)
    if args.match:
        names = [n for n in names if re.search(args.match, n)]
    if args.subset:
        names = representative_subset(root, names)
    t0 = time.monotonic()

    def progress(res, done, total):
        if args.verbose or res.outcome == "failed":
            print(f"[{done}/{total} {time.monotonic() - t0:.0f}s] {res.case}: {res.outcome} {res.kind} "
                  f"{res.detail[:300]}", flush=True)

    results = sweep(root, names, workers=args.workers, timeout=args.timeout, progress=progress)
    wall = time.monotonic() - t0
    print(markdown(results))
    print(f"{len(results)} cases in {wall:.0f} s with {args.workers} worker(s)")
    if args.ops_table:
        with open(args.ops_table, "w") as f:
            f.write(ops_markdown(results) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary(results), "wall_seconds": round(wall, 1), "workers": args.workers,
                       "results": [asdict(r) for r in results]}, f, indent=1)
    return 0 if not any(r.outcome == "failed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
