"""Runs the commands the README and docs/ show, as written, on small stand-ins.

A page's shell blocks run in ``bash`` with this module standing in for ``tvm-fusion``, ``python``, ``pip`` and the
other programs they name (``PATH`` shims): each call is rewritten to a CI-sized one and then run for real. What is
rewritten, and why:

* **files**: every ONNX file a page names is a stand-in made once per session: MiniLM and BERT files are a
  one-layer all-MiniLM-L6-v2 (real weights, dynamic batch and sequence; ``*_s128.onnx`` static at 128 tokens),
  decoders (``llama*.onnx``) a one-layer random-weight LLaMA with 4 K/V heads of 64 (``llama_big.onnx``, the
  prefill benchmark's file, a tiny LLaMA without a cache), any other model a two-layer
  random-weight DistilBERT (``input_ids`` and ``attention_mask`` only, as the pages' Python examples feed it); an
  artifact a command reads but the page never built is the MiniLM stand-in's, compiled once.
* **effort**: tuning trials, repeats, seeds, replay budgets and batch lengths are cut to a few; results that
  the docs keep in the repository (``docs/tuning_replay.*``) are written to the working directory instead.
* **not run here**, each with where its substance is tested: installs, the test suite and the docs build (CI's
  own steps), RPC servers (long-running; ``tests/robustness/test_faults.py`` starts a tracker), and the GPU side
  of the campaign and of ``gpu_check.py`` (a GPU; ``tests/tools/test_gpu_campaign.py`` runs it on the CPU).

``python tests/documented_commands.py PROGRAM ARGS...`` is what a shim calls; ``run_page`` drives a page.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`((?:TVM_USE_RUNTIME_LIB=1 )?tvm-fusion [^`]+)`")
PROGRAMS = ("tvm-fusion", "python", "python3", "pip", "sphinx-build", "jupyter")

#: (pattern over the command line, why it is not run here and where its substance is tested)
NOT_RUN = [
    (r"^pip ", "an install: CI's own first step"),
    (r"^python3? -m pytest", "the test suite itself"),
    (r"^sphinx-build ", "the docs build itself (CI runs it with -W)"),
    (r"^jupyter nbconvert", "rewrites the notebooks in place (the docs build executes them)"),
    (r"-m tvm\.exec\.rpc_(tracker|server)", "a server that runs until stopped (tests/robustness starts a tracker)"),
    (r" --rpc ", "needs a GPU behind an RPC tracker"),
    (r"gpu_campaign (run|pool-pack)", "the GPU side of the campaign (tests/tools/test_gpu_campaign.py runs it on the CPU)"),
    (r"gpu_check\.py run", "runs on a GPU (tests/gpu)"),
]

#: placeholders the docs use for values, by the flag before them
PLACEHOLDERS = {"--batch": {"B": "1"}, "--seq": {"S": "64"}, "--past": {"P": "16"}, "--precision": {"P": "int8"}}


def _placeholder(flag: str, value: str) -> str:
    return PLACEHOLDERS.get(flag, {}).get(value, value)


def _stand_in_dir() -> pathlib.Path:
    return pathlib.Path(os.environ["TFX_DOC_STAND_INS"])


def make_stand_ins(where: pathlib.Path) -> None:
    """The session's stand-in models and artifact under ``where`` (made once)."""
    from tvm_fusion_ext.compile import compile_artifact
    from tvm_fusion_ext.models import export_hf_model
    from tvm_fusion_ext.models.causal_lm import export_causal_lm

    where.mkdir(parents=True, exist_ok=True)
    if not (where / "encoder.onnx").is_file():
        export_hf_model("minilm", where / "encoder.onnx", num_layers=1, dynamic=True)
    if not (where / "generic.onnx").is_file():
        export_hf_model("distilbert", where / "generic.onnx", dynamic=True)
    if not (where / "prefill.onnx").is_file():
        export_hf_model("llama", where / "prefill.onnx", dynamic=True)
    if not (where / "encoder_s128.onnx").is_file():
        export_hf_model("minilm", where / "encoder_s128.onnx", num_layers=1, seq=128)
    if not (where / "decoder.onnx").is_file():
        export_causal_lm(where / "decoder.onnx", "tiny", hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4)
    if not (where / "encoder_art" / "manifest.json").is_file():
        compile_artifact(str(where / "encoder.onnx"), str(where / "encoder_art"),
                         max_shapes={"input_ids": [8, 128], "attention_mask": [8, 128], "token_type_ids": [8, 128]})
    import numpy as np

    from tvm_fusion_ext.models import sample_inputs

    for npz, model in (("x.npz", "encoder.onnx"), ("generic.npz", "generic.onnx")):
        if not (where / npz).is_file():
            np.savez(where / npz, **sample_inputs(str(where / model), batch=1, seq=16))


def _provide(arg: str) -> None:
    """Put the stand-in for the file or artifact ``arg`` names where the command looks for it, if absent."""
    path = pathlib.Path(arg)
    if path.exists() or arg.startswith("-"):
        return
    stand_ins = _stand_in_dir()
    if arg.endswith(".onnx"):
        name = path.name.lower()
        source = "prefill.onnx" if "llama_big" in name else "decoder.onnx" if "llama" in name else \
            "encoder_s128.onnx" if "s128" in name else \
            "encoder.onnx" if re.search("minilm|bert", name) else "generic.onnx"
    elif arg.endswith(".npz") and not re.search(r"out|^y\.", path.name):
        source = "x.npz" if path.name == "x.npz" else "generic.npz"   # the pages' x.npz is MiniLM's
    else:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(stand_ins / source, path)


def _provide_artifact(arg: str) -> None:
    path = pathlib.Path(arg)
    if not path.exists() and not arg.startswith("-") and not arg.endswith((".onnx", ".npz", ".json")):
        shutil.copytree(_stand_in_dir() / "encoder_art", path)


def _cap(argv, flag, value):
    """``flag N`` lowered to ``value`` (a number, or a function of the documented string)."""
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a == flag:
            out[i + 1] = value(out[i + 1]) if callable(value) else str(min(int(out[i + 1]), value))
    return out


def _small_lengths(spec: str) -> str:
    lo, _, hi = spec.partition("-")
    return f"{min(int(lo), 16)}-{min(int(hi or lo), 64)}"


def rewrite_tvm_fusion(argv):
    """A documented ``tvm-fusion`` call, CI-sized, with its inputs provided."""
    argv = [_placeholder(argv[i - 1] if i else "", a) for i, a in enumerate(argv)]
    command = argv[0] if argv else ""
    for a in argv[1:]:
        _provide(a)
    if command in ("run", "bench", "info") and len(argv) > 1:
        _provide_artifact(argv[1])
    for i, a in enumerate(argv[:-1]):
        if a == "--warm-start" and not pathlib.Path(argv[i + 1]).exists():   # another model's records
            shutil.copytree(ROOT / "tuning_logs", argv[i + 1])
    argv = _cap(argv, "--trials", 2)
    if command == "tune" and "--trials" not in argv and "--build-only" not in argv:
        argv += ["--trials", "2"]   # the default budget is 64
    argv = _cap(argv, "--repeat", 2)
    argv = _cap(argv, "--build-only", 2)
    argv = _cap(argv, "--batch", 4)
    argv = _cap(argv, "--past", 64)
    argv = _cap(argv, "--lengths", _small_lengths)
    argv = _cap(argv, "--seq", lambda s: ",".join(str(min(int(v), 64)) for v in s.split(",")))
    return argv


def rewrite_python(argv):
    """A documented ``python`` call, CI-sized."""
    if argv[:2] == ["-m", "tvm_fusion_ext.tools.tuning_lab"]:
        argv = _cap(argv, "--trials", 4)
        argv = _cap(argv, "--budget", 16)
        argv = _cap(argv, "--seeds", lambda s: s.split(",")[0] if "," in s else str(min(int(s), 2)))
        argv = [a.replace("docs/", "") if a.startswith("docs/") else a for a in argv]
        if "--tasks" in argv:   # one task, two strategies: the replay's paths, not its statistics
            argv = _cap(argv, "--tasks", lambda s: s.split(",")[0])
            argv = _cap(argv, "--strategies", lambda s: ",".join(s.split(",")[:2]))
        argv = [str(ROOT / a) if a.startswith("tuning_pools/") else a for a in argv]
    if argv[:3] == ["-m", "tvm_fusion_ext.tools.gpu_campaign", "build"]:   # one small part: nvcc, the paths
        argv = [*argv, "--quick", *([] if "--parts" in argv else ["--parts", "norms"])]
    if len(argv) > 1 and argv[0] == "scripts/gpu_check.py":
        argv = [str(ROOT / argv[0]), *argv[1:]]
    return argv


def dispatch(program: str, argv) -> int:
    """What a shim runs: the call rewritten, or a note that it is not run here."""
    line = " ".join([program, *argv])
    for pattern, why in NOT_RUN:
        if re.search(pattern, line):
            print(f"[not run here: {why}] {line}", file=sys.stderr)
            return 0
    done = _stand_in_dir() / "ran_without_files.txt"
    file_free = program == "tvm-fusion" and not any(pathlib.Path(a).exists() or re.search(r"\.(onnx|npz|json)$", a)
                                                    for a in argv)
    if file_free and done.is_file() and line in done.read_text().splitlines():
        print(f"[ran before, with the same result] {line}", file=sys.stderr)
        return 0
    env = dict(os.environ)
    env["PATH"] = env["TFX_DOC_REAL_PATH"]
    if program == "tvm-fusion":
        call = [sys.executable, "-m", "tvm_fusion_ext.cli", *rewrite_tvm_fusion(argv)]
    elif program in ("python", "python3"):
        call = [sys.executable, *rewrite_python(argv)]
    else:
        call = [program, *argv]
    print(f"[run] {shlex.join(call[1:] if call[0] == sys.executable else call)}", file=sys.stderr, flush=True)
    code = subprocess.run(call, env=env).returncode
    if code == 0 and file_free:   # a command that reads no file (demo, kernel benches) runs once per session
        with open(done, "a") as f:
            f.write(line + "\n")
    return code


def _shims(where: pathlib.Path) -> pathlib.Path:
    shims = where / "shims"
    shims.mkdir(parents=True, exist_ok=True)
    for program in PROGRAMS:
        shim = shims / program
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(__file__)} {program} "$@"\n')
        shim.chmod(0o755)
    return shims


def page_scripts(page: pathlib.Path):
    """(kind, text) in page order: ``bash`` blocks, ``python`` blocks, then each concrete inline command."""
    text = page.read_text()
    for lang, body in FENCE.findall(text):
        if lang in ("bash", "sh", "shell"):
            yield "bash", re.sub(r"\s\[--[^\]]*\]", "", body)   # an optional flag shown in brackets
        elif lang == "python" and not re.match(r"\s*class ", body):   # class excerpts: see test_excerpts_are_code
            yield "python", body
    for span in INLINE.findall(text):
        if not re.search(r"\[|\||\.\.\.|…|<", span):
            yield "inline", " ".join(span.split())   # markdown wraps a long span over lines


#: what a page's Python blocks may use without defining it: the inputs their prose describes
PYTHON_PREAMBLE = """\
import numpy as np
import tvm_fusion_ext as tfx
import dataclasses as _dataclasses
import tvm_fusion_ext.tune as _tune_module
from tvm_fusion_ext.tune.driver import TuneOptions as _TuneOptions
_tune = _tune_module.tune
_tune_module.tune = lambda *a, options=None, **k: _tune(
    *a, options=_dataclasses.replace(options or _TuneOptions(), trials=2), **k)
ids = np.array([[1, 5, 9, 2], [0, 1, 7, 2]], dtype=np.int64)   # the second row left-padded
mask = (ids != 0).astype(np.int64)
types = np.zeros_like(ids)
prompt_ids = ids
"""


def run_page(page: pathlib.Path, workdir: pathlib.Path, stand_ins: pathlib.Path, timeout: int = 1800):
    """Every command of ``page`` in ``workdir``: the failures (script, output tail) and everything printed."""
    env = dict(os.environ, TFX_DOC_STAND_INS=str(stand_ins), TFX_DOC_REAL_PATH=os.environ["PATH"],
               PATH=f"{_shims(workdir)}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if not (workdir / "tuning_logs").exists():   # the shipped records, as in a checkout
        shutil.copytree(ROOT / "tuning_logs", workdir / "tuning_logs")
    failures, printed = [], []
    for kind, text in page_scripts(page):
        if kind == "python":
            _with_env(env, _provide, "model.onnx", workdir)
            defines_mod = re.search(r"^mod = ", text, re.M)
            mod_line = "" if defines_mod or not re.search(r"\bmod\b", text) else "mod = tfx.load_onnx('model.onnx')\n"
            call = [sys.executable, "-c", PYTHON_PREAMBLE + mod_line + text]
        elif kind == "inline":
            argv = shlex.split(text)
            while argv and re.match(r"^[A-Z_]+=", argv[0]):
                argv = argv[1:]
            if _names_a_command_only(argv):
                continue
            call = ["bash", "-c", text]
        else:
            call = ["bash", "-c", "set -euo pipefail\n" + text]
        res = subprocess.run(call, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)
        printed.append(res.stdout)
        if res.returncode != 0:
            failures.append((text.strip()[:300], (res.stdout[-1500:] + res.stderr[-2500:]).strip()))
    return failures, "".join(printed)


def _with_env(env, fn, arg, cwd):
    old_env, old_cwd = dict(os.environ), os.getcwd()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        fn(arg)
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)


def _names_a_command_only(argv) -> bool:
    """An inline span that names a command or flag without what it needs (``tvm-fusion tune``, ``--space X``
    alone): a reference in prose, parsed by the parse test, not a command to run."""
    from tvm_fusion_ext.cli import build_parser

    import contextlib
    import io

    args = [_placeholder(argv[i] if i else "", a) for i, a in enumerate(argv[1:])]
    if len(args) < 2:
        return True   # `tvm-fusion bench`, `tvm-fusion demo` named in a sentence
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(args)
    except SystemExit as exit_:
        return exit_.code != 0
    return False


if __name__ == "__main__":
    sys.exit(dispatch(sys.argv[1], sys.argv[2:]))
