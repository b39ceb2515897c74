"""Every chapter's full preset, smoke-tested: every phase and arm at its model sizes, each loop capped (Config.SMOKE),
on the CPU, writing no results file. Keeps a full preset from rotting before a GPU ever runs it."""
import dataclasses
import importlib
import os
import re
import time

import pytest
from conftest import ROOT

from iclr25_repro.core import cli

# Chapters whose smoke run cannot be as cheap as about 10 s, and why. LONG ones run; SLOW ones run only with
# ICLR25_SLOW=1 (the command `python -m iclr25_repro experiment <slug> --scale full --smoke` always works).
LONG = {
    "longhorn": "the full preset's models at 128 wide evaluated at length 256 by the chunked scan on a CPU: about 25 s",
}
SLOW = {}


def chapters_with_experiments():
    return sorted(p.parent.name for p in (ROOT / "iclr25_repro").glob("*/experiment.py"))


def covered_by_chapter_tests(slug: str) -> bool:
    "True when tests/test_<slug>.py runs the smoke itself (a test function whose name says smoke)."
    path = ROOT / "tests" / f"test_{slug}.py"
    return path.is_file() and re.search(r"^def test_\w*smoke\w*\(", path.read_text(), re.M) is not None


def test_every_slow_chapter_exists():
    assert set(LONG) | set(SLOW) <= set(chapters_with_experiments())


@pytest.mark.parametrize("slug", chapters_with_experiments())
def test_full_preset_smoke(slug, tmp_root):
    if covered_by_chapter_tests(slug):
        pytest.skip(f"tests/test_{slug}.py runs this chapter's smoke run")
    if slug in SLOW and os.environ.get("ICLR25_SLOW") != "1":
        pytest.skip(f"{slug}: {SLOW[slug]} (ICLR25_SLOW=1 runs it)")
    module = importlib.import_module(f"iclr25_repro.{slug}.experiment")
    full, smoke = module.Config.preset("full"), module.Config.preset("full", smoke=True, device="cpu")
    for f in dataclasses.fields(full):   # model sizes, arms and phases stay at the full preset
        if f.name not in module.Config.SMOKE and f.name not in ("device", "smoke"):
            assert getattr(smoke, f.name) == getattr(full, f.name), f.name
    start = time.perf_counter()
    doc = cli.run_experiment(slug, "full", "cpu", 0, smoke=True)
    seconds = time.perf_counter() - start
    assert doc["scale"] == "full" and doc["config"]["smoke"] is True and doc["claims"]
    assert not (tmp_root / "book" / "results").exists(), "a smoke run must write no results file"
    print(f"{slug}: full-preset smoke run {seconds:.1f} s")


def chapters_with_a_laptop_preset():
    out = []
    for slug in chapters_with_experiments():
        module = importlib.import_module(f"iclr25_repro.{slug}.experiment")
        if "laptop" in module.Config.PRESETS:
            out.append(slug)
    return out


@pytest.mark.parametrize("slug", chapters_with_a_laptop_preset() or [None])
def test_laptop_preset_smoke_and_dry_run(slug, tmp_root, capsys):
    "The laptop preset, like the full one: every phase for an iteration or two on the CPU, and its plan."
    if slug is None:
        pytest.skip("no chapter has a laptop preset yet")
    module = importlib.import_module(f"iclr25_repro.{slug}.experiment")
    laptop, smoke = module.Config.preset("laptop"), module.Config.preset("laptop", smoke=True, device="cpu")
    for f in dataclasses.fields(laptop):   # sizes, arms and phases stay at the laptop preset
        if f.name not in module.Config.SMOKE and f.name not in ("device", "smoke"):
            assert getattr(smoke, f.name) == getattr(laptop, f.name), f.name
    doc = cli.run_experiment(slug, "laptop", "cpu", 0, smoke=True)
    assert doc["scale"] == "laptop" and doc["config"]["smoke"] is True and doc["provenance"]["key"]
    assert not (tmp_root / "book" / "results").exists(), "a smoke run must write no results file"
    assert cli.main(["experiment", slug, "--scale", "laptop", "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert f"{slug} at scale laptop" in plan and "estimate" in plan
