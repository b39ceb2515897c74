"""The book's structure: every chapter is executable by papermill at the right scale, listed, and tested."""
import json
import re

import pytest
from conftest import ROOT

NBS = ROOT / "nbs"
PARAMETERS = {"scale": '"ci"', "device": '"auto"', "seed": "0"}


def chapters():
    return sorted(p.name for p in NBS.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")) and p.name != "core")


def parameters_problems(nb: dict) -> list[str]:
    "What is wrong with a notebook's `parameters` cell (empty when it is exactly scale/device/seed)."
    cells = [c for c in nb["cells"] if c["cell_type"] == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        return [f"expected one cell tagged 'parameters', found {len(cells)}"]
    src = "".join(cells[0]["source"])
    lines = [l.split("#")[0].strip() for l in src.splitlines()]
    found = dict(re.fullmatch(r"(\w+)\s*=\s*(.+)", l).groups() for l in lines if l and re.fullmatch(r"(\w+)\s*=\s*(.+)", l))
    found = {k: v.replace("'", '"') for k, v in found.items()}
    problems = [f"{k} = {found.get(k)} (expected {v})" for k, v in PARAMETERS.items() if found.get(k) != v]
    problems += [f"unexpected parameter {k}" for k in found if k not in PARAMETERS]
    problems += [f"not an assignment: {l!r}" for l in lines if l and not re.fullmatch(r"(\w+)\s*=\s*(.+)", l)]
    return problems


def _nb(src, tags=("parameters",)):
    return {"cells": [{"cell_type": "code", "metadata": {"tags": list(tags)}, "source": src}]}


def test_parameters_checker_itself():
    assert parameters_problems(_nb('scale = "ci"\ndevice = "auto"\nseed = 0')) == []
    assert parameters_problems(_nb("scale = 'ci'  # preset\ndevice = 'auto'\nseed = 0")) == []
    assert parameters_problems(_nb('scale = "full"\ndevice = "auto"\nseed = 0'))
    assert parameters_problems(_nb('scale = "ci"\ndevice = "auto"'))
    assert parameters_problems(_nb('scale = "ci"\ndevice = "auto"\nseed = 0\nn = 3'))
    assert parameters_problems(_nb('scale = "ci"\ndevice = "auto"\nseed = 0', tags=()))


@pytest.mark.parametrize("slug", chapters())
def test_chapter_files(slug):
    evals = sorted((NBS / slug).glob("*evaluation*.ipynb"))
    assert evals, f"nbs/{slug} has no evaluation notebook"
    for nb_path in evals:
        problems = parameters_problems(json.loads(nb_path.read_text()))
        assert not problems, f"{nb_path}: {problems}"
    assert (ROOT / "tests" / f"test_{slug}.py").is_file(), f"tests/test_{slug}.py is missing"


def test_every_notebook_is_in_the_toc():
    toc = (ROOT / "book" / "_toc.yml").read_text()
    listed = set(re.findall(r"file:\s*(\S+)", toc))
    for nb_path in NBS.rglob("*.ipynb"):
        rel = nb_path.relative_to(NBS)
        if any(p.startswith(("_", ".")) for p in rel.parts):
            continue
        assert str(rel.with_suffix("")) in listed, f"{rel} is not in book/_toc.yml"
    for entry in listed - {"scorecard"}:
        assert (NBS / f"{entry}.ipynb").is_file() or (ROOT / "book" / f"{entry}.md").is_file(), f"toc entry {entry} has no source"


def test_notebooks_are_clean_and_keep_tags():
    for nb_path in NBS.rglob("*.ipynb"):
        nb = json.loads(nb_path.read_text())
        for c in nb["cells"]:
            assert not c.get("outputs"), f"{nb_path} has outputs: run python -m iclr25_repro check-clean"
            assert set(c.get("metadata", {})) <= {"tags"}, f"{nb_path}: cell metadata {c['metadata']}"


def test_exports_go_to_submodules():
    for nb_path in NBS.rglob("*.ipynb"):
        for c in json.loads(nb_path.read_text())["cells"]:
            m = re.search(r"^#\|\s*default_exp\s+(\S+)", "".join(c["source"]), re.M)
            if m and nb_path.parent.name != "core":
                assert m.group(1).startswith(nb_path.parent.name + "."), f"{nb_path}: exports to {m.group(1)}"


def test_settings_keep_papermill_tags():
    ini = (ROOT / "settings.ini").read_text()
    assert re.search(r"^recursive\s*=\s*True", ini, re.M)
    assert re.search(r"^allowed_cell_metadata_keys\s*=\s*tags", ini, re.M)
    # nbdev 2's clear_all = True deletes all cell metadata, the parameters tag included
    assert re.search(r"^clear_all\s*=\s*False", ini, re.M)


# --- the corrected contract (../shared/CHAPTER.md: claims and checks, full preset) --------------------------------
# The chapters written before the contract was corrected, with the issue that revises each. A revision removes its
# chapter from this table; every other chapter, every new one included, is held to all the rules below.
AWAITING_REVISION = {}
CLOSING = re.compile(r"^##\s+What reproduced", re.M)
HEADING = re.compile(r"^#{1,2}\s", re.M)
# a measured number typed into prose: a decimal, a percentage, or a number with thousands separators
TYPED_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?%|(?<![\w.$^_{])\d+\.\d+(?![\w.])|(?<![\w.])\d{1,3}(?:,\d{3})+(?![\d])")


def revised_chapters():
    return [s for s in chapters() if s not in AWAITING_REVISION]


def _src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def closing_section_problems(nb: dict) -> list[str]:
    "What is wrong with an evaluation's closing section (empty when it is rendered from the results)."
    cells = nb["cells"]
    starts = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and CLOSING.search(_src(c))]
    if len(starts) != 1:
        return [f"expected one Markdown heading '## What reproduced, what did not, and why', found {len(starts)}"]
    head = _src(cells[starts[0]])
    section, prose = [], [head[CLOSING.search(head).end():].split("\n", 1)[-1]]
    for c in cells[starts[0] + 1:]:
        if c["cell_type"] == "markdown" and HEADING.search(_src(c)):
            break
        section.append(c)
        if c["cell_type"] == "markdown":
            prose.append(_src(c))
    problems = []
    if not any(c["cell_type"] == "code" and "closing_section(" in _src(c) for c in section):
        problems.append("the closing section is only Markdown: render it with iclr25_repro.core.report.closing_section "
                        "from the run's records")
    typed = sorted({m for text in prose for m in TYPED_NUMBER.findall(text)})
    if typed:
        problems.append(f"the closing section's Markdown types numbers {typed[:6]}: quote them from the results "
                        "(iclr25_repro.core.report.say)")
    return problems


def results_problems(doc: dict) -> list[str]:
    "What a revised chapter's results document lacks under the corrected contract."
    problems = []
    claims = [c for c in doc["claims"] if c.get("kind") == "claim"]
    if not claims:
        problems.append("no claim: a chapter tests at least one claim of its paper (checks alone are not a reproduction)")
    for c in doc["claims"]:
        if c.get("kind") not in ("claim", "check"):
            problems.append(f"{c.get('id')}: no kind")
    for c in claims:
        if c["verdict"] == "not_run":
            continue
        if c.get("interval") is None:
            problems.append(f"{c['id']}: a decided claim needs the interval its rule used (core.results.paired_interval)")
        if (c.get("replicates") or 0) < 3:
            problems.append(f"{c['id']}: {c.get('replicates')} replicates; a claim needs at least 3 (seeds, worlds, problems)")
        if c.get("paper") is not None and c.get("paper_tests") is None:
            problems.append(f"{c['id']}: the paper gives a number; say whether the rule tests its direction or its size")
        if c.get("delta") is None or not str(c.get("delta_reason") or "").strip():
            problems.append(f"{c['id']}: a decided claim states the smallest effect that matters (delta=, with "
                            "delta_reason=), fixed before the run")
    return problems


def _closing_nb(*cells):
    return {"cells": [{"cell_type": k, "metadata": {}, "source": s} for k, s in cells]}


def test_closing_section_checker_itself():
    good = _closing_nb(("markdown", "## What reproduced, what did not, and why"),
                       ("code", "#| echo: false\nclosing_section(out['claims'], why)"),
                       ("markdown", "At ci scale the models are small; the full preset has 3 seeds."),
                       ("markdown", "## Appendix\nNumbers here (0.5) are not the closing section's."))
    assert closing_section_problems(good) == []
    only_md = _closing_nb(("markdown", "## What reproduced, what did not, and why\n\n- C1 reproduced."))
    assert "only Markdown" in closing_section_problems(only_md)[0]
    typed = _closing_nb(("markdown", "## What reproduced, what did not, and why"), ("code", "closing_section(r, w)"),
                        ("markdown", "C1 reached 0.58 against 80.2% in the paper, on 10,000 battles."))
    assert "types numbers ['0.58', '10,000', '80.2%']" in closing_section_problems(typed)[0]
    assert "found 0" in closing_section_problems(_closing_nb(("markdown", "## Results")))[0]
    # math and identifiers are not measurements
    assert closing_section_problems(_closing_nb(("markdown", "## What reproduced, what did not, and why"),
                                                ("code", "closing_section(r, w)"),
                                                ("markdown", "Eq. (3) with $10^{-10}$ and `x_1.5`; C1, K = 8."))) == []


def test_results_checker_itself():
    iv = {"of": "d", "estimate": 1.0, "lo": 0.5, "hi": 1.5, "level": 0.95, "method": "Student t, 2 df", "n": 3}
    ok = {"kind": "claim", "id": "C1", "verdict": "reproduced", "interval": iv, "replicates": 3, "paper": 0.8,
          "paper_tests": "direction", "delta": 0.2, "delta_reason": "half the paper's gain"}
    chk = {"kind": "check", "id": "K1", "verdict": "passed"}
    assert results_problems({"claims": [ok, chk]}) == []
    assert results_problems({"claims": [chk]}) == ["no claim: a chapter tests at least one claim of its paper "
                                                   "(checks alone are not a reproduction)"]
    assert results_problems({"claims": [dict(ok, verdict="not_run", interval=None, replicates=None)]}) == []
    p = results_problems({"claims": [dict(ok, interval=None, replicates=1, paper_tests=None, delta=None)]})
    assert len(p) == 4 and "interval" in p[0] and "1 replicates" in p[1] and "direction or its size" in p[2]
    assert "smallest effect" in p[3]


@pytest.mark.parametrize("slug", revised_chapters())
def test_closing_section_is_rendered_from_the_results(slug):
    for nb_path in sorted((NBS / slug).glob("*evaluation*.ipynb")):
        problems = closing_section_problems(json.loads(nb_path.read_text()))
        assert not problems, f"{nb_path}: {problems}"


@pytest.mark.parametrize("slug", revised_chapters())
def test_results_follow_the_contract(slug):
    import os
    from iclr25_repro.core.results import load_results
    path = ROOT / "book" / "results" / slug / "ci.json"
    if not path.is_file():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{path} is missing: CI executes every chapter before the tests")
        pytest.skip(f"{path} is missing: run `make chapter CH={slug}` first")
    problems = results_problems(load_results(path))
    assert not problems, f"{path}: {problems}"


@pytest.mark.parametrize("slug", revised_chapters())
def test_full_preset_has_a_smoke_run_and_a_plan(slug):
    import importlib
    module = importlib.import_module(f"iclr25_repro.{slug}.experiment")
    assert module.Config.SMOKE, f"{slug}: Config.SMOKE must cap the full preset's loops for the smoke run"
    assert callable(getattr(module, "plan", None)), f"{slug}: experiment.plan(cfg) must list the full preset's phases"
    assert module.plan(module.Config.preset("full")), f"{slug}: plan(cfg) returned nothing"


def test_revision_table_names_existing_chapters():
    assert set(AWAITING_REVISION) <= set(chapters()), sorted(set(AWAITING_REVISION) - set(chapters()))


@pytest.mark.parametrize("slug", revised_chapters())
def test_evaluation_shows_every_scale(slug):
    "The claims table shows ci beside the committed laptop and full results, and the closing section says which decides."
    src = "".join("".join(c["source"]) for p in sorted((NBS / slug).glob("*evaluation*.ipynb"))
                  for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "code")
    assert "scales_markdown(" in src, f"{slug}: show the claims with core.report.scales_markdown(doc)"
    assert re.search(r"closing_section\([^)]*chapter=", src, re.S), f"{slug}: closing_section(..., chapter=slug)"


def test_book_workflow_runs_the_ci_stages():
    "The workflow that publishes the book runs the same make stages as .ci/run, in the same order, then deploys."
    stages = re.search(r"for stage in ([\w -]+); do", (ROOT / ".ci" / "run").read_text()).group(1).split()
    wf = (ROOT / ".github" / "workflows" / "book.yml").read_text()
    made = re.findall(r"^\s*run: make ([\w -]+)$", wf, re.M)
    assert made == [" ".join(stages)], (made, stages)
    for needed in ("actions/upload-pages-artifact", "actions/deploy-pages", "path: book/_build/html", "branches: [main]"):
        assert needed in wf, needed


def test_committed_results_validate_and_say_where_they_came_from():
    "Every committed laptop or full result validates and carries its provenance (a stale one is shown, not failed)."
    from iclr25_repro.core.results import COMMITTED_SCALES, load_results
    for scale in COMMITTED_SCALES:
        for path in (ROOT / "book" / "results").glob(f"*/{scale}.json"):
            doc = load_results(path)
            assert doc["chapter"] == path.parent.name and doc["scale"] == scale, path
            assert doc["provenance"]["key"] and doc["provenance"]["command"], path


@pytest.mark.parametrize("slug", chapters())
def test_chapter_package_exports_its_public_api(slug):
    "from iclr25_repro.<slug> import <name> works for every name the chapter's implementation modules export."
    import importlib
    from iclr25_repro.core.cli import package_init
    init = ROOT / "iclr25_repro" / slug / "__init__.py"
    assert init.read_text() == package_init(slug), f"regenerate: python -m iclr25_repro inits"
    pkg = importlib.import_module(f"iclr25_repro.{slug}")
    assert pkg.__all__, f"{slug}: no public names"
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None, f"iclr25_repro.{slug}.{name}"
