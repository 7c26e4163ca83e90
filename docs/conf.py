"""Sphinx configuration: the Markdown pages (MyST), the API reference from the package's docstrings (autodoc), and
the walkthrough notebooks executed during the build so that they render with their outputs (myst-nb).

Build: ``pip install -e ".[docs]"`` then ``sphinx-build -W --keep-going -b html docs docs/_build/html``.
The notebooks are committed without outputs; this build is where they run (``.ci/run`` runs it once).
"""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)  # the checkout's package, not an installed copy
# and the same for the notebooks' kernels (they run in docs/notebooks, where the checkout is not on the path)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)

import tvm_fusion_ext  # noqa: E402

project = "tvm_fusion_ext"
author = "tvm_fusion_ext contributors"
release = version = tvm_fusion_ext.__version__

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
# docs/notebooks links to the repository's notebooks/; its README is the notebooks' index page.
# docs/padding-free.md and the tuning lab's data files are pages/figures in their own right.
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "tuning_replay.json"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
# Links to files of the repository outside docs/ (tests, scripts, the package's sources) are plain links.
suppress_warnings = ["myst.xref_missing"]

# --- notebooks: executed on every build, a failing cell fails the build -----------------------------------
nb_execution_mode = "force"
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
# the notebooks name the kernel "python3": whatever it resolves to must be this interpreter's environment
nb_kernel_rgx_aliases = {".*": "python3"}

# --- API reference ------------------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = f"tvm_fusion_ext {release}"
html_static_path = []
