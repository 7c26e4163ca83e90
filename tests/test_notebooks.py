"""The walkthrough notebooks in ``notebooks/``: all five are there, and each is committed without outputs, with
a unique id per cell, as a valid nbformat file.

They are *executed* by the documentation build (``sphinx-build -W ... docs``: myst-nb runs every cell and a
failing cell fails the build; ``.ci/run`` runs it once after the test tiers), which renders them with their
outputs. ``test_docs_build_executes_the_notebooks`` checks that the build is configured to do so.
"""

from __future__ import annotations

import json
import pathlib

import pytest

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def test_notebooks_exist():
    names = [p.name for p in NOTEBOOKS]
    assert names == ["01_fusion_passes.ipynb", "02_operators_and_schedules.ipynb", "03_tuning_xgboost.ipynb",
                     "04_end_to_end.ipynb", "05_deploy.ipynb"], names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    import nbformat

    # nbformat >= 4.5 requires a unique id per cell; today's nbformat adds missing ones when it reads (with a
    # warning), a future one refuses the file: checked on the file as committed
    raw = json.loads(path.read_text())
    ids = [cell.get("id") for cell in raw["cells"]]
    assert None not in ids, f"{path.name} cell {ids.index(None)} has no id (nbformat.validator.normalize adds one)"
    assert len(set(ids)) == len(ids), f"{path.name} has repeated cell ids"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs: clear them before committing"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"


def test_docs_build_executes_the_notebooks():
    """The docs build is where the notebooks run: every one is in its table of contents, and execution is forced
    with errors raised (a failing cell fails ``sphinx-build -W``)."""
    docs = NOTEBOOK_DIR.parent / "docs"
    conf = (docs / "conf.py").read_text()
    assert 'nb_execution_mode = "force"' in conf and "nb_execution_raise_on_error = True" in conf
    assert (docs / "notebooks").resolve() == NOTEBOOK_DIR
    index = (docs / "index.md").read_text()
    for path in NOTEBOOKS:
        assert f"notebooks/{path.stem}" in index, f"{path.name} is not in docs/index.md's table of contents"
