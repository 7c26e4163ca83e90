"""The accuracy contract of a reduced-precision compilation: its outputs against the fp32 build of the same model,
on sample inputs, per output.

Per output: the largest absolute difference, and the cosine similarity of each row (the last axis: one token's
hidden state, one sentence's embedding) to the fp32 row, as its mean and minimum. The contract holds when every
float output's minimum row cosine reaches the precision's floor (:data:`MIN_COSINE`); ``compile`` records the
figures in the artifact manifest either way and says when the contract fails.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

#: the least row cosine to fp32 each precision promises on its sample inputs
MIN_COSINE = {"bf16": 0.999, "int8": 0.99}


def row_cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row (last axis) of ``got`` to the same row of ``want``; a row that is zero in
    both counts as 1."""
    g = np.asarray(got, np.float64).reshape(-1, got.shape[-1] if got.ndim else 1)
    w = np.asarray(want, np.float64).reshape(g.shape)
    dot = (g * w).sum(-1)
    norm = np.linalg.norm(g, axis=-1) * np.linalg.norm(w, axis=-1)
    return np.where(norm > 0, dot / np.where(norm > 0, norm, 1.0), np.where(np.abs(g - w).max(-1) == 0, 1.0, 0.0))


def compare(names: Sequence[str], got: Sequence[Sequence[np.ndarray]], want: Sequence[Sequence[np.ndarray]],
            precision: str, min_cosine: Optional[float] = None) -> dict:
    """The contract over samples: ``got[s][i]`` / ``want[s][i]`` is output ``i`` of sample ``s`` in ``precision``
    / in fp32."""
    floor = MIN_COSINE.get(precision, 1.0) if min_cosine is None else float(min_cosine)
    outputs: Dict[str, dict] = {}
    for i, name in enumerate(names):
        pairs = [(np.asarray(g[i]), np.asarray(w[i])) for g, w in zip(got, want)]
        diff = max(float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max()) if g.size else 0.0
                   for g, w in pairs)
        entry = {"max_abs_diff": diff}
        if all(np.issubdtype(w.dtype, np.floating) for _, w in pairs):
            cos = np.concatenate([row_cosines(g, w) for g, w in pairs])
            entry.update(mean_cosine=float(cos.mean()), min_cosine=float(cos.min()), rows=int(cos.size),
                         passed=bool(cos.min() >= floor))
        outputs[name] = entry
    passed = all(e.get("passed", True) for e in outputs.values())
    return {"against": "fp32", "samples": len(got), "min_cosine_required": floor, "passed": passed,
            "outputs": outputs}


def describe(accuracy: dict) -> str:
    """The contract in a few lines, for the terminal."""
    verdict = "holds" if accuracy.get("passed") else "FAILS"
    lines = [f"accuracy vs fp32 on {accuracy.get('samples')} sample input set(s) ({accuracy.get('inputs', 'given')}):"
             f" contract {verdict} (row cosine >= {accuracy.get('min_cosine_required')})"]
    for name, e in accuracy.get("outputs", {}).items():
        cos = (f", cosine mean {e['mean_cosine']:.6f} min {e['min_cosine']:.6f} over {e['rows']} rows"
               if "mean_cosine" in e else "")
        lines.append(f"  {name}: max abs diff {e['max_abs_diff']:.3g}{cos}")
    return "\n".join(lines)


def run_compiled(compiled, inputs: Sequence[np.ndarray]) -> List[np.ndarray]:
    """Outputs of a CPU compilation (lifted weights passed after the inputs) on ``inputs``."""
    import tvm
    from tvm import relax

    from ..deploy.io import flatten_outputs

    dev = tvm.cpu()
    vm = relax.VirtualMachine(compiled.executable, dev)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    args += [tvm.runtime.tensor(v, dev) for _, v in compiled.weights]
    return flatten_outputs(vm["main"](*args))


def measure(mod, compiled, reference, samples: Sequence[Mapping[str, np.ndarray]], source: str = "given",
            min_cosine: Optional[float] = None) -> dict:
    """``compiled`` (a reduced-precision :class:`~.pipeline.Compiled` of ``mod``) against ``reference``, the fp32
    build of ``mod`` with the same target and fusion, on ``samples``."""
    from ..deploy.io import check_inputs
    from ..frontend import input_specs, output_names
    from ..frontend.dims import bound_reasons, shape_bounds

    specs, bounds, reasons = input_specs(mod), shape_bounds(mod), bound_reasons(mod)
    got, want = [], []
    for i, sample in enumerate(samples):
        arrays = check_inputs(specs, sample, f"sample input {i + 1} of {len(samples)}", bounds, reasons)
        got.append(run_compiled(compiled, arrays))
        want.append(run_compiled(reference, arrays))
    out = compare(output_names(mod), got, want, compiled.precision_name, min_cosine)
    out["inputs"] = source
    return out
