"""The site's own Sphinx extension: what is generated at build time, and the checks that fail the build.

Everything generated goes under ``docs/generated/`` (git-ignored), written afresh on every build:

* ``generated/api/<module>.rst`` — one page per public module (no ``_`` in its dotted path): the
  module docstring, then every name of its ``__all__``. A name is documented once, on the page of
  the public module that defines it (or, for names defined in a private module, the first public
  module exporting it); every other module exporting it lists it with a link, and the name under
  that module resolves too (``avalanche_plugins.layer_adaptive.LayerAdaptiveEWCPlugin``).
* ``generated/results/<slug>.md`` — one page per ``## `` section of ``docs/RESULTS.md`` (headings in
  fenced code blocks are not sections), with relative links and images fixed up; ``index.md``
  holds RESULTS.md's preamble and an index of verdicts (each section's ``**Verdict...**``
  paragraphs, and the rows of a section named "Verdicts ...").
* ``generated/examples/`` — the scripts of ``examples/`` staged for sphinx-gallery: each docstring
  gets the RST title sphinx-gallery needs (its first line); the gallery header comes from
  ``examples/README.md``.

Checks (each a Sphinx warning, so an error under ``-W``): every name of every public module's
``__all__`` has an entry in the Python domain (:func:`check_public_names`); math is rendered as
text (:func:`add_math_renderer`): no script is loaded from a network the site may not reach.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
GENERATED = DOCS / "generated"
PACKAGE = "avalanche_plugins"
# The pages the API reference groups modules into: (page, title, module prefixes).
API_GROUPS = [
    ("avalanche_plugins", "avalanche_plugins: plugins, metrics, loggers, fixes", ["avalanche_plugins"]),
    ("core", "core: the layer map, calls, checks, statistics", ["avalanche_plugins.core"]),
    ("layer_adaptive", "layer_adaptive: curvature, Fisher, schedules, LayerAdaptiveEWC",
     ["avalanche_plugins.layer_adaptive"]),
    ("structural", "structural: masks, Grow / Prune", ["avalanche_plugins.structural"]),
    ("readiness", "readiness: Optimization Readiness", ["avalanche_plugins.readiness"]),
    ("ads", "ads: Architecture-Driven Shift", ["avalanche_plugins.ads"]),
    ("transport", "transport: transport keys", ["avalanche_plugins.transport"]),
    ("study", "study: the study runner's Python API", ["avalanche_plugins.study"]),
    ("study.catalog", "study.catalog: datasets, the model zoo, scenarios, names", ["avalanche_plugins.study.catalog"]),
    ("study.jobs", "study.jobs: executors, the cache, the protocol", ["avalanche_plugins.study.jobs"]),
]


# --------------------------------------------------------------------------------------------------
# The public API: modules, their __all__, where each name is documented


@dataclass
class PublicApi:
    """Every public module, its exported names, and the one module documenting each object."""

    modules: dict[str, list[str]] = field(default_factory=dict)  # module -> __all__ (None: [])
    home: dict[str, str] = field(default_factory=dict)  # "module.name" -> "home_module.name"

    def entries(self) -> list[str]:
        """Every ``module.name`` that must resolve in the API reference."""
        return [f"{m}.{n}" for m, names in self.modules.items() for n in names]


def is_public(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split("."))


def public_modules() -> list[str]:
    """The package and every submodule without a ``_``-prefixed component, in walk order."""
    package = importlib.import_module(PACKAGE)
    names = [PACKAGE] + [m.name for m in pkgutil.walk_packages(package.__path__, PACKAGE + ".")]
    return [name for name in names if is_public(name)]


def public_api() -> PublicApi:
    """Import every public module; a name's home is the public module defining it, else the
    shortest public module exporting it."""
    api = PublicApi()
    for name in public_modules():
        module = importlib.import_module(name)
        api.modules[name] = list(getattr(module, "__all__", []))
    exporters: dict[int, list[str]] = {}
    for mod_name, names in api.modules.items():
        module = importlib.import_module(mod_name)
        for name in names:
            exporters.setdefault(id(getattr(module, name)), []).append(mod_name)
    for mod_name, names in api.modules.items():
        module = importlib.import_module(mod_name)
        for name in names:
            obj = getattr(module, name)
            defined = getattr(obj, "__module__", None)
            candidates = exporters[id(obj)]
            if not callable(obj) or defined not in candidates:
                # data, or defined in a private module: the shortest exporting path documents it
                defined = min(candidates, key=lambda m: (m.count("."), len(m)))
            api.home[f"{mod_name}.{name}"] = f"{defined}.{name}"
    return api


def group_of(module: str) -> str:
    """The API page a module belongs to: the longest matching prefix of :data:`API_GROUPS`."""
    best = max((p for page, _, prefixes in API_GROUPS for p in prefixes
                if module == p or (module.startswith(p + ".") and p != PACKAGE)), key=len, default=PACKAGE)
    return next(page for page, _, prefixes in API_GROUPS if best in prefixes)


def directive_for(obj) -> str:
    if inspect.isclass(obj):
        return "autoclass"
    if callable(obj):  # functions, also wrapped ones (functools.lru_cache)
        return "autofunction"
    return "autodata"


def module_rst(api: PublicApi, mod_name: str) -> str:
    module = importlib.import_module(mod_name)
    lines = [f".. automodule:: {mod_name}", "   :no-members:", ""]
    own, elsewhere = [], []
    for name in api.modules[mod_name]:
        home = api.home[f"{mod_name}.{name}"]
        (own if home == f"{mod_name}.{name}" else elsewhere).append((name, home))
    if elsewhere:
        lines += ["Also exported here:", ""]
        lines += [f"* :py:obj:`{name} <{home}>` (``{home}``)" for name, home in elsewhere]
        lines.append("")
    for name, _ in own:
        kind = directive_for(getattr(module, name))
        lines.append(f".. {kind}:: {mod_name}.{name}")
        if kind == "autoclass":
            lines += ["   :members:", "   :show-inheritance:"]
        if kind == "autodata":
            lines.append("   :no-value:")
        lines.append("")
    return "\n".join(lines)


def write_api(api: PublicApi) -> None:
    out = GENERATED / "api"
    out.mkdir(parents=True, exist_ok=True)
    pages: dict[str, list[str]] = {page: [] for page, _, _ in API_GROUPS}
    for mod_name in api.modules:
        pages[group_of(mod_name)].append(mod_name)
    index = ["API reference", "=============", "",
             "Every public name of ``avalanche_plugins``, generated from the docstrings (their doctests",
             "run in ``make test``). A name is documented once, in the module that defines it; the",
             "modules re-exporting it link there.", "", ".. toctree::", "   :maxdepth: 2", ""]
    for page, title, _ in API_GROUPS:
        index.append(f"   {page}")
        body = [title, "=" * len(title), ""]
        for mod_name in pages[page]:
            heading = f"``{mod_name}``"
            body += [heading, "-" * len(heading), "", module_rst(api, mod_name), ""]
        write_if_changed(out / f"{page}.rst", "\n".join(body))
    write_if_changed(out / "index.rst", "\n".join(index) + "\n")


def write_if_changed(path: Path, text: str) -> None:
    """Keep the mtime of an unchanged page, so an incremental build rereads only what changed."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


# --------------------------------------------------------------------------------------------------
# Results: one page per section of docs/RESULTS.md


def slugify(title: str) -> str:
    """GitHub's (and MyST's ``myst_heading_anchors``) heading anchor."""
    slug = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return slug.replace(" ", "-")


def split_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``(preamble, [(title, body)])`` at every ``## `` line outside fenced code blocks."""
    preamble, sections, fence = [], [], None
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            mark = stripped[:3]
            fence = None if fence == mark else (fence or mark)
        if fence is None and line.startswith("## "):
            sections.append([line[3:].strip(), []])
            continue
        (sections[-1][1] if sections else preamble).append(line)
    return "".join(preamble), [(title, "".join(body)) for title, body in sections]


def fix_links(body: str, anchors: dict[str, str]) -> str:
    """Relative links of RESULTS.md as seen from ``generated/results/``: section anchors to their
    page, other docs pages and images under ``docs/`` two folders up."""

    def link(match: re.Match) -> str:
        bang, text, target = match.group(1), match.group(2), match.group(3)
        if re.match(r"^[a-z]+:", target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        if not path:
            page = anchors.get(anchor)
            if page is None:
                return match.group(0)
            target = f"{page}.md" if anchor == page else f"{page}.md#{anchor}"
        else:
            target = f"../../{target}"
        return f"{bang}[{text}]({target})"

    return re.sub(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)", link, body)


def promote(body: str) -> str:
    """A section's ``### `` headings one level up (the section title is its page's ``# ``)."""
    lines, fence = [], None
    for line in body.splitlines(keepends=True):
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            mark = stripped[:3]
            fence = None if fence == mark else (fence or mark)
        if fence is None and re.match(r"^#{3,6} ", line):
            line = line[1:]
        lines.append(line)
    return "".join(lines)


def verdicts(title: str, slug: str, body: str) -> list[str]:
    """The index lines of one section: its ``**Verdict...**`` paragraphs, or a verdict table's rows."""
    lines = []
    for para in re.split(r"\n\s*\n", body):
        flat = " ".join(re.sub(r"\n\s*[-*] ", " • ", para).split())
        if flat.startswith("**Verdict"):
            short = flat if len(flat) <= 400 else flat[:400].rsplit(" ", 1)[0] + " …"
            if short.count("`") % 2:  # a code span cut in the middle
                short = short[:short.rindex("`")].rstrip() + " …"
            if short.count("**") % 2:  # a bold span cut in the middle
                short = short.rstrip(" …") + "** …"
            lines.append(f"- [{title}]({slug}.md): {short}")
    if title.lower().startswith("verdicts"):
        for row in body.splitlines():
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            if row.startswith("|") and len(cells) >= 2 and not set(cells[0]) <= set("-: ") \
                    and cells[0] != "claim":
                lines.append(f"- [{title}]({slug}.md): {cells[0]} — {cells[1]}")
    return lines


def write_results() -> list[str]:
    """The results pages; returns their slugs in RESULTS.md's order."""
    out = GENERATED / "results"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    preamble, sections = split_sections((DOCS / "RESULTS.md").read_text())
    pages = {title: slugify(title) for title, _ in sections}
    anchors: dict[str, str] = {}
    for title, body in sections:
        anchors[slugify(title)] = slugify(title)
        for heading in re.findall(r"^#{3,6} (.+)$", body, flags=re.M):
            anchors.setdefault(slugify(heading), slugify(title))
    index_lines: list[str] = []
    for title, body in sections:
        slug = pages[title]
        source = "Generated at build time from the section of `docs/RESULTS.md` of the same name."
        text = f"# {title}\n\n{fix_links(promote(body), anchors)}\n\n---\n\n_{source}_\n"
        (out / f"{slug}.md").write_text(text)
        index_lines += verdicts(title, slug, body)
    preamble = preamble.split("\n", 1)[1] if preamble.startswith("# ") else preamble
    toc = "\n".join(pages.values())
    index = (f"# Results\n\n{fix_links(preamble, anchors)}\n\n## Verdicts\n\n"
             "Each section's verdicts, linked to the page that holds the evidence:\n\n"
             + "\n".join(index_lines or ["- (no verdict recorded yet)"])
             + f"\n\n```{{toctree}}\n:maxdepth: 1\n:caption: Results pages\n\n{toc}\n```\n")
    (out / "index.md").write_text(index)
    return list(pages.values())


# --------------------------------------------------------------------------------------------------
# The examples gallery


def stage_examples() -> None:
    """``examples/*.py`` with an RST title on each docstring, and a gallery header from the README."""
    out = GENERATED / "examples"
    out.mkdir(parents=True, exist_ok=True)
    scripts = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))
    for path in scripts:
        text = path.read_text()
        first = text[3:].split("\n", 1)[0].strip()
        title = f"{path.stem[:2]}. {first.split(':')[0].rstrip('.')}"
        staged = f'"""{title}\n{"=" * len(title)}\n\n{text[3:]}'
        # sphinx-gallery runs the code with ``__doc__ = ""``; the scripts' argparse reads its first line
        main = staged.index('\nif __name__ == "__main__":')
        staged = (staged[:main] + "\n# sphinx_gallery_start_ignore\n"
                  f"__doc__ = {first!r}\n# sphinx_gallery_end_ignore\n" + staged[main:])
        write_if_changed(out / path.name, staged)
    for stale in set(out.glob("*.py")) - {out / p.name for p in scripts}:
        stale.unlink()
    write_if_changed(out / "GALLERY_HEADER.rst", gallery_header((ROOT / "examples" / "README.md").read_text()))


def md_inline_to_rst(text: str) -> str:
    text = re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", text)
    text = re.sub(r"\[``([^`]+)``\]\((\d\d_\w+)\.py\)", r":ref:`\1 <sphx_glr_generated_gallery_\2.py>`", text)
    return re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r"\1 (``\2``)", text)


def gallery_header(readme: str) -> str:
    """examples/README.md as reStructuredText (its paragraphs, one code block, one table)."""
    out, block, table = ["Examples gallery", "================", ""], None, []
    for line in readme.splitlines()[1:]:
        if line.startswith("```"):
            block = None if block is not None else line[3:] or "text"
            out += ([f".. code-block:: {block}", ""] if block is not None else [""])
            continue
        if block is not None:
            out.append("   " + line)
        elif line.startswith("|"):
            cells = [md_inline_to_rst(c.strip()) for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                table.append(cells)
        else:
            if table:
                out += [".. list-table::", "   :header-rows: 1", ""]
                for row in table:
                    out += [f"   * - {row[0]}"] + [f"     - {c}" for c in row[1:]]
                out.append("")
                table = []
            out.append(md_inline_to_rst(line))
    return "\n".join(out) + "\n"


def gallery_argv(gallery_conf, script_vars) -> list[str]:
    """sphinx-gallery's ``reset_argv``: each script writes under the git-ignored ``out/docs/``;
    ``DOCS_GALLERY_ARGS`` (e.g. ``--quick``) is passed on."""
    name = Path(str(script_vars["src_file"])).stem[:2]
    extra = os.environ.get("DOCS_GALLERY_ARGS", "").split()
    out = ROOT / "out" / "docs" / "gallery_outputs" / name  # relative: no machine path on the page
    return [*extra, "--out", os.path.relpath(out, Path(str(script_vars["src_file"])).parent)]


# --------------------------------------------------------------------------------------------------
# Sphinx hooks


def generate(app) -> None:
    """``config-inited``: write every generated page before sphinx-gallery and the reader run."""
    GENERATED.mkdir(exist_ok=True)
    app.avp_api = public_api()
    write_api(app.avp_api)
    write_results()
    stage_examples()


def add_aliases(app, env) -> None:
    """``env-updated``: each re-export resolves to its home's entry."""
    domain = env.get_domain("py")
    objects = domain.objects
    for entry, home in app.avp_api.home.items():
        if entry != home and home in objects and entry not in objects:
            target = objects[home]
            objects[entry] = target._replace(aliased=True)


def missing_entries(api: PublicApi, objects) -> list[str]:
    """The ``module.name`` of every public ``__all__`` name without a Python-domain entry."""
    return [entry for entry in api.entries() if entry not in objects]


def check_public_names(app, env) -> None:
    """``env-check-consistency``: a name of a public ``__all__`` without an API entry is a warning."""
    from sphinx.util import logging

    for entry in missing_entries(app.avp_api, env.get_domain("py").objects):
        logging.getLogger(__name__).warning("public name without an API entry: %s", entry)


def resolve_unqualified(app, env, node, contnode):
    """``missing-reference``: a Python reference by short name (``:func:`discover_layers```) resolves
    when exactly one documented object ends with that name."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    domain = env.get_domain("py")
    matches = [name for name, entry in domain.objects.items()
               if (name == target or name.endswith("." + target)) and not entry.aliased]
    if len(matches) != 1:
        return None
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"] if node["reftype"] != "obj"
                               else "obj", matches[0], node, contnode)


def tidy_docstring(app, what, name, obj, options, lines) -> None:
    """``autodoc-process-docstring`` (after napoleon): a constant without a docstring of its own
    shows none (not its type's, ``dict.__doc__``); ``:param a, b: text`` documents ``a`` and ``b``
    together (Sphinx would read ``a,`` as a type)."""
    if what in ("data", "attribute") and not (inspect.isclass(obj) or callable(obj)) \
            and getattr(obj, "__doc__", None) == getattr(type(obj), "__doc__", None):
        lines[:] = []
        return
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*):param ([\w*]+(?:,\s*[\w*]+)+):(.*)$", line)
        if match:
            names = ",".join(n.strip() for n in match.group(2).split(","))
            lines[i] = f"{match.group(1)}:param {names}:{match.group(3)}"


def visit_math_text(self, node) -> None:
    from docutils import nodes

    self.body.append(self.starttag(node, "span", "", CLASS="math notranslate"))
    self.body.append(self.encode(node.astext()))
    self.body.append("</span>")
    raise nodes.SkipNode


def visit_math_block_text(self, node) -> None:
    from docutils import nodes

    self.body.append(self.starttag(node, "div", CLASS="math notranslate"))
    self.body.append(self.encode(node.astext()))
    self.body.append("</div>\n")
    raise nodes.SkipNode


def setup(app):
    app.connect("config-inited", lambda app, config: generate(app), priority=100)
    app.connect("env-updated", add_aliases)
    app.connect("env-check-consistency", check_public_names)
    app.connect("missing-reference", resolve_unqualified)
    app.connect("autodoc-process-docstring", tidy_docstring, priority=600)
    app.add_html_math_renderer("text", (visit_math_text, None), (visit_math_block_text, None))
    return {"parallel_read_safe": False, "parallel_write_safe": True}
