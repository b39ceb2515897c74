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
