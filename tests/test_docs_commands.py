"""The commands the README and docs/ show are commands that work.

Every ``tvm-fusion ...`` line of a fenced shell block, and every concrete inline ``tvm-fusion ...`` span (one with
no ``[optional]`` or ``a|b`` notation), is parsed by the CLI's own argument parser: a renamed command or a flag
that no longer exists fails here. ``python scripts/X.py`` lines must name a script that exists. The quick start
(README and docs/quickstart.md: shell and Python) runs end to end on the built-in encoder, in the slow tier.
The notebooks are executed by the docs build, not here.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "notebooks" / "README.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`((?:TVM_USE_RUNTIME_LIB=1 )?tvm-fusion [^`]+)`")
#: what a documented command line may start with before the program: environment assignments


#: placeholders the docs use for numbers, given a value of the right type to parse
PLACEHOLDERS = {"B": "1", "S": "128", "N": "8", "P": "64"}


def _split_commands(line: str):
    """A shell line as argv lists, split at ``&&``, ``;`` and ``|`` outside quotes."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    argv = []
    for token in lexer:
        if token in ("&&", ";", "|", "||"):
            if argv:
                yield argv
            argv = []
        else:
            argv.append(token)
    if argv:
        yield argv


def _shell_lines(text: str):
    """Logical lines of the fenced ``bash``/``sh`` blocks (continuations joined, comments dropped)."""
    for lang, body in FENCE.findall(text):
        if lang not in ("bash", "sh", "shell"):
            continue
        body = body.replace("\\\n", " ")
        for line in body.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                yield line


def documented_commands():
    """(page, argv, inline) for every command shown: ``inline`` for a span in the prose, which may name a command
    without its required arguments (a reference to it rather than a command to run)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        rel = str(page.relative_to(ROOT))
        for line in _shell_lines(text):
            found += [(rel, argv, False) for argv in _split_commands(line)]
        for span in INLINE.findall(text):
            if not re.search(r"\[|\||\.\.\.|…|<", span):
                found += [(rel, argv, True) for argv in _split_commands(span)]
    commands = []
    for page, argv, inline in found:
        while argv and re.match(r"^[A-Z_]+=", argv[0]):  # environment assignments before the program
            argv = argv[1:]
        if argv and argv[0] in ("tvm-fusion", "python"):
            commands.append((page, argv, inline))
    return commands


COMMANDS = documented_commands()


def test_the_docs_show_commands():
    """The extraction finds the commands (a broken extractor would pass every check below vacuously)."""
    pages = {page for page, _, _ in COMMANDS}
    assert {"README.md", "docs/quickstart.md", "docs/cli.md", "docs/tuning.md", "docs/deploying.md"} <= pages
    assert sum(1 for _, argv, inline in COMMANDS if argv[0] == "tvm-fusion" and not inline) >= 20


@pytest.mark.parametrize("page,argv,inline", COMMANDS,
                         ids=[f"{p}:{' '.join(a)[:60]}" for p, a, _ in COMMANDS])
def test_documented_command_parses(page, argv, inline):
    import contextlib
    import io

    from tvm_fusion_ext.cli import build_parser

    command = " ".join(argv)
    if argv[0] == "tvm-fusion":
        args = [PLACEHOLDERS.get(a, a.replace("$MODEL", "model.onnx")) for a in argv[1:]]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                build_parser().parse_args(args)
        except SystemExit as exit_:  # argparse: 2 for an unknown command or flag; --version and --help exit 0
            message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""
            reference = inline and "the following arguments are required" in message
            assert exit_.code == 0 or reference, f"{page}: `{command}` does not parse: {message}"
    elif argv[:2] == ["python", "-m"]:
        module = argv[2]
        if module.startswith("tvm."):
            return  # TVM's own RPC tools
        if importlib.util.find_spec(module.split(".")[0]) is None:
            pytest.skip(f"{module}: its package is not installed")
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is None and module.startswith("tvm_fusion_ext.tools.tuning_lab"):
            pytest.skip("the tuning lab's single entry point is not in this tree yet")
        assert spec is not None, f"{page}: `{command}` names a module that does not exist"
    elif len(argv) > 1 and argv[1].endswith(".py"):
        assert (ROOT / argv[1]).is_file(), f"{page}: `{command}` names a script that does not exist"


def _cli_script(block: str) -> str:
    """A documented shell block as a script that runs this checkout's CLI."""
    cli = f"{shlex.quote(sys.executable)} -m tvm_fusion_ext.cli"
    return "set -euo pipefail\n" + re.sub(r"(^|\s)tvm-fusion ", lambda m: f"{m[1]}{cli} ", block)


def _block_after(text: str, heading: str, lang: str) -> str:
    rest = text[text.index(heading):]
    return next(body for lg, body in FENCE.findall(rest) if lg == lang)


@pytest.mark.slow
@pytest.mark.parametrize("page,heading", [("README.md", "## Quick start"), ("docs/quickstart.md", "## Five commands")])
def test_quick_start_runs(page, heading, tmp_path):
    """The quick start's shell block, as written, on the built-in encoder: fuse, compile, run the artifact under a
    runtime-only TVM, bench against ONNX Runtime."""
    block = _block_after((ROOT / page).read_text(), heading, "bash")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run(["bash", "-c", _cli_script(block)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=1200, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (tmp_path / "tiny_art" / "manifest.json").is_file() and (tmp_path / "y.npz").is_file()
    assert "Near misses" in res.stdout and "vs ORT" in res.stdout


@pytest.mark.slow
def test_quick_start_python_runs(tmp_path):
    """docs/quickstart.md's Python block, as written."""
    code = _block_after((ROOT / "docs" / "quickstart.md").read_text(), "## From Python", "python")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Fused operators:" in res.stdout and "last_hidden_state" in res.stdout


@pytest.mark.slow
def test_readme_decoder_example_runs(tmp_path):
    """The README's decoder blocks, as written (compile with the documented bounds, generate, time a decode step),
    on a one-layer random-weight LLaMA with the example's cache layout (4 K/V heads of 64) as ``llama.onnx``."""
    pytest.importorskip("transformers")
    from tvm_fusion_ext.models.causal_lm import export_causal_lm

    export_causal_lm(tmp_path / "llama.onnx", "tiny", hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=4)
    text = (ROOT / "README.md").read_text()
    section = text[text.index("Generate tokens with a compiled KV-cache decoder"):]
    (compile_lang, compile_block), (py_lang, py_block), (bench_lang, bench_block) = FENCE.findall(section)[:3]
    assert (compile_lang, py_lang, bench_lang) == ("bash", "python", "bash")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))

    def shell(block):
        res = subprocess.run(["bash", "-c", _cli_script(block)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=1200, env=env)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return res.stdout

    shell(compile_block)
    prompt = "import numpy as np\nprompt_ids = np.array([[5, 9, 13], [0, 7, 21]])\nmask = np.array([[1, 1, 1], [0, 1, 1]])\n"
    res = subprocess.run([sys.executable, "-c", prompt + py_block + "\nprint(tokens.shape)"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1].startswith("(2, ")
    assert "GB/s" in shell(bench_block)
