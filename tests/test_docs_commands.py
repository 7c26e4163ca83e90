"""The commands the README and docs/ show are commands that work.

Every ``tvm-fusion ...`` line of a fenced shell block, and every concrete inline ``tvm-fusion ...`` span (one with
no ``[optional]`` or ``a|b`` notation), is parsed by the CLI's own argument parser: a renamed command or a flag
that no longer exists fails here. ``python scripts/X.py`` lines must name a script that exists. In the slow
tier every page's commands also run, as written, on small stand-ins (:mod:`documented_commands`), and the quick
start and the decoder example are checked for what they print. The notebooks are executed by the docs build.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shlex

import pytest
from documented_commands import make_stand_ins, run_page
from documented_commands import page_scripts as _page_scripts

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


#: what a page's commands must print (the quick start's report and comparison, the decoder's bandwidth figure)
EXPECTED_OUTPUT = {"README.md": ("Near misses", "vs ORT", "GB/s"),
                   "docs/quickstart.md": ("Near misses", "vs ORT", "Fused operators:", "last_hidden_state")}
RUN_PAGES = [page for page in PAGES if any(True for _ in _page_scripts(page))]


@pytest.fixture(scope="session")
def stand_ins(tmp_path_factory):
    pytest.importorskip("transformers")
    where = tmp_path_factory.mktemp("doc_stand_ins")
    make_stand_ins(where)
    return where


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(ROOT)) for p in RUN_PAGES])
def test_documented_commands_run(page, stand_ins, tmp_path):
    """Every shell block, Python block and concrete inline command of the page runs, in page order, on the small
    stand-ins (:mod:`documented_commands` says what is rewritten for CI and what is not run here, and why)."""
    failures, printed = run_page(page, tmp_path, stand_ins)
    assert not failures, "\n\n".join(f"`{text}` failed:\n{tail}" for text, tail in failures)
    for expected in EXPECTED_OUTPUT.get(str(page.relative_to(ROOT)), ()):
        assert expected in printed, f"{page.name}: the commands ran but never printed {expected!r}"


def test_code_excerpts_are_the_code():
    """A class shown in the docs as an example (contributing.md's worked examples) is the package's own code, so
    the example cannot drift from what runs (comments aside)."""
    def flat(code):   # the docs annotate the excerpt with comments of their own
        return re.sub(r"\s+", " ", re.sub(r"\s*#[^\n]*", "", code)).strip()

    sources = flat("\n".join(p.read_text() for p in (ROOT / "tvm_fusion_ext").rglob("*.py")))
    excerpts = [body for page in PAGES for lang, body in FENCE.findall(page.read_text())
                if lang == "python" and re.match(r"\s*class ", body)]
    assert excerpts
    for body in excerpts:
        assert flat(body) in sources, f"not in the package's code:\n{body[:300]}"
