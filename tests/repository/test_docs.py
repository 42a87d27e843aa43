"""The documentation site's configuration is consistent, without building it (``make docs`` builds
it with warnings as errors and ``docs/browser_check.py`` opens it in chromium; CI runs both)."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

from tests import REPO_ROOT

ROOT = REPO_ROOT
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
avp_docs = importlib.import_module("avp_docs")


@pytest.fixture(scope="module")
def api():
    return avp_docs.public_api()


def test_every_public_name_has_an_api_entry(api):
    pages = {module: avp_docs.module_rst(api, module) for module in api.modules}
    assert "avalanche_plugins.study" in api.modules and "avalanche_plugins.core.layers" in api.modules
    assert not any(part.startswith("_") for m in api.modules for part in m.split("."))
    for entry in api.entries():
        module, name = entry.rsplit(".", 1)
        home = api.home[entry]
        home_module = home.rsplit(".", 1)[0]
        assert re.search(rf"^\.\. auto\w+:: {re.escape(home)}$", pages[home_module], re.M), entry
        if home != entry:  # a re-export links to the one entry
            assert f"<{home}>" in pages[module], entry
    assert api.home["avalanche_plugins.LayerAdaptiveEWCPlugin"] == \
        "avalanche_plugins.layer_adaptive.ewc_plugin.LayerAdaptiveEWCPlugin"
    assert api.home["avalanche_plugins.TidyCSVLogger"] == "avalanche_plugins.TidyCSVLogger"  # private home


def test_every_public_module_is_on_an_api_page(api):
    pages = [page for page, _, _ in avp_docs.API_GROUPS]
    assert {avp_docs.group_of(m) for m in api.modules} == set(pages)
    assert avp_docs.group_of("avalanche_plugins.study.jobs.cache") == "study.jobs"
    assert avp_docs.group_of("avalanche_plugins.study.catalog.zoo") == "study.catalog"
    assert avp_docs.group_of("avalanche_plugins.study.api") == "study"
    assert avp_docs.group_of("avalanche_plugins") == "avalanche_plugins"


def test_results_split_at_sections_outside_code_blocks():
    text = "# R\n\nintro [A](#a-b)\n\n## A b\n\n```bash\n## not a section\n```\n### Sub\n\n![f](results/x.png)\n## C\n\nsee [sub](#sub) [ADS](ads.md)\n"
    preamble, sections = avp_docs.split_sections(text)
    assert [title for title, _ in sections] == ["A b", "C"]
    assert "## not a section" in sections[0][1]
    anchors = {"a-b": "a-b", "sub": "a-b", "c": "c"}
    assert avp_docs.fix_links(preamble, anchors).strip().endswith("[A](a-b.md)")
    body = avp_docs.fix_links(avp_docs.promote(sections[0][1]), anchors)
    assert "![f](../../results/x.png)" in body and "\n## Sub\n" in body and "## not a section" in body
    assert "[sub](a-b.md#sub)" in avp_docs.fix_links(sections[1][1], anchors)
    assert "[ADS](../../ads.md)" in avp_docs.fix_links(sections[1][1], anchors)


def test_results_md_sections_and_their_images_exist():
    _, sections = avp_docs.split_sections((DOCS / "RESULTS.md").read_text())
    assert len(sections) >= 10 and len({avp_docs.slugify(t) for t, _ in sections}) == len(sections)
    for _, body in sections:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", body):
            assert (DOCS / target).exists(), target


def test_every_page_is_in_a_toctree():
    index = (DOCS / "index.md").read_text()
    pages = [p.relative_to(DOCS).with_suffix("").as_posix()
             for p in [*DOCS.glob("*.md"), *DOCS.glob("guide/*.md")] if p.name not in ("index.md", "RESULTS.md")]
    for page in pages:
        assert re.search(rf"^{re.escape(page)}$", index, re.M), f"{page} is in no toctree of docs/index.md"
    for generated in ("generated/api/index", "generated/gallery/index", "generated/results/index"):
        assert re.search(rf"^{generated}$", index, re.M)


def test_gallery_header_from_examples_readme():
    rst = avp_docs.gallery_header((ROOT / "examples" / "README.md").read_text())
    assert rst.startswith("Examples gallery\n================\n")
    assert ":ref:`01_layer_adaptive_ewc.py <sphx_glr_generated_gallery_01_layer_adaptive_ewc.py>`" in rst
    assert ".. list-table::" in rst and ".. code-block:: bash" in rst


def test_readme_is_a_short_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    cells = [c for line in text.splitlines() if line.startswith("|") for c in line.strip("|").split("|")]
    assert max(map(len, cells)) <= 200
    start, end = text.index("<!-- demo-table:start -->"), text.index("<!-- demo-table:end -->")
    assert text[start:end].count("\n| ") >= 3 and "make demo" in text and "make test" in text


def test_a_name_without_api_entry_is_reported():
    api = avp_docs.PublicApi(modules={"pkg": ["a", "b"], "pkg.sub": ["a"]})
    assert avp_docs.missing_entries(api, {"pkg.a": 1, "pkg.sub.a": 1}) == ["pkg.b"]
