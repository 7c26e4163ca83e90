"""Fast builds on targets that tensorize nothing: MetaSchedule's ``TuneContext`` and every builder worker
import ``tvm.s_tir.tensor_intrin``, a 30 s import on 2 cores that llvm and SIMT CUDA never use."""

from __future__ import annotations

import contextlib
import sys
import types


def skip_tensor_intrin() -> None:
    """Builder-worker initializer: stub ``tvm.s_tir.tensor_intrin`` (a 30 s import on 2 cores that every
    builder pool would pay) when nothing is tensorized (llvm, SIMT CUDA)."""
    sys.modules.setdefault("tvm.s_tir.tensor_intrin", types.ModuleType("tvm.s_tir.tensor_intrin"))


@contextlib.contextmanager
def stub_tensor_intrinsics(enabled: bool):
    """The same stub in this process (TuneContext imports the package) for the run only, so a later
    tensor-core user in the same process still gets the real registry."""
    added = enabled and "tvm.s_tir.tensor_intrin" not in sys.modules
    if added:
        skip_tensor_intrin()
    try:
        yield
    finally:
        if added and getattr(sys.modules.get("tvm.s_tir.tensor_intrin"), "__file__", None) is None:
            sys.modules.pop("tvm.s_tir.tensor_intrin", None)
