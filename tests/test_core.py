"""Tests of iclr25_repro.core: devices, seeds, presets, results, scorecard and runner helpers."""
import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch

from iclr25_repro.core import cli, report, results, runtime, scorecard


# --- runtime -------------------------------------------------------------------------------------
def test_pick_device():
    assert runtime.pick_device("auto").type in ("cpu", "cuda")
    assert runtime.pick_device("cpu") == torch.device("cpu")
    assert runtime.pick_device(torch.device("cpu")) == torch.device("cpu")
    for bad in ["tpu", "", 3]:
        with pytest.raises(ValueError, match="device"):
            runtime.pick_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            runtime.pick_device("cuda")


def test_seed_everything_is_deterministic():
    def draw(seed):
        runtime.seed_everything(seed)
        return np.random.rand(3), torch.nn.Linear(4, 2).weight.detach().clone(), torch.rand(2)
    a, b, c = draw(7), draw(7), draw(8)
    assert np.array_equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    assert not torch.equal(a[1], c[1])
    for bad in [-1, 1.5, "0", True]:
        with pytest.raises(ValueError, match="seed"):
            runtime.seed_everything(bad)


def test_local_generators():
    assert np.array_equal(runtime.np_rng(3).normal(size=4), runtime.np_rng(3).normal(size=4))
    g = runtime.np_rng(5)
    assert runtime.np_rng(g) is g
    x = torch.randn(4, generator=runtime.torch_rng(3))
    assert torch.equal(x, torch.randn(4, generator=runtime.torch_rng(3)))


def test_quiet(monkeypatch):
    monkeypatch.delenv("ICLR25_QUIET", raising=False)
    monkeypatch.setenv("CI", "true")
    assert runtime.is_quiet()
    monkeypatch.setenv("ICLR25_QUIET", "0")
    assert not runtime.is_quiet()
    assert list(runtime.progress(range(3), quiet=True)) == [0, 1, 2]


@dataclass
class _Cfg(runtime.ScaledConfig):
    n: int = 10
    PRESETS: ClassVar[dict] = {"tiny": dict(n=1), "ci": {}, "full": dict(n=1000)}


def test_presets():
    assert _Cfg.preset("tiny").n == 1 and _Cfg.preset("ci") == _Cfg()
    cfg = _Cfg.preset("full", seed=2, device="cpu")
    assert (cfg.n, cfg.seed, cfg.scale, cfg.device) == (1000, 2, "full", "cpu")
    assert cfg.to_dict()["n"] == 1000
    with pytest.raises(ValueError, match="scale"):
        _Cfg.preset("huge")
    with pytest.raises(ValueError, match="no field"):
        _Cfg.preset("ci", m=3)
    with pytest.raises(ValueError, match="device"):
        _Cfg(device="gpu")
    with pytest.raises(ValueError, match="seed"):
        _Cfg(seed=-1)


# --- results -------------------------------------------------------------------------------------
def _claim(ours=0.9, half=0.004, **kw):
    "A claim of ours against a baseline of 0.85, decided on an interval of the difference of half-width `half`, delta 0.02."
    d = None if ours is None else float(ours) - 0.85
    iv = None if d is None else {"of": "mean of ours - baseline", "estimate": d, "lo": d - half, "hi": d + half,
                                 "level": 0.95, "method": "t", "n": 3}
    return results.claim("acc", "Beats the baseline.", "accuracy", paper=0.91, ours=ours, baseline=0.85, interval=iv,
                         delta=0.02, delta_reason="half the paper's gain of 0.04",
                         rule="decide(interval of ours - baseline, delta = 0.02)", **kw)


def test_claim_verdicts():
    assert _claim(0.9)["verdict"] == "reproduced"
    assert _claim(0.86)["verdict"] == "partial"
    assert _claim(0.86, half=0.02)["verdict"] == "inconclusive"
    assert _claim(0.5)["verdict"] == "not_reproduced"
    assert _claim(0.852)["verdict"] == "not_reproduced"
    assert _claim(None)["verdict"] == "not_run"
    assert _claim(np.float32(0.9))["ours"] == pytest.approx(0.9)
    assert _claim(0.9)["delta"] == 0.02 and _claim(0.9)["gates"] == [] and _claim(0.9)["better"] == "higher"
    iv = {"of": "d", "estimate": 0.05, "lo": 0.04, "hi": 0.06, "level": 0.95, "method": "t", "n": 3}
    assert results.claim("x", "c", "m", paper=None, ours=float("nan"), rule="r", interval=iv, delta=0.02,
                         delta_reason="r")["verdict"] == "not_run"
    with pytest.raises(ValueError, match="rule"):
        results.claim("x", "c", "m", paper=None, ours=1.0, rule="", interval=iv, delta=0.02, delta_reason="r")
    with pytest.raises(ValueError, match="delta"):                          # no smallest effect stated
        results.claim("x", "c", "m", paper=None, ours=1.0, rule="r", interval=iv)
    with pytest.raises(ValueError, match="delta_reason"):                   # a delta needs its reason
        results.claim("x", "c", "m", paper=None, ours=1.0, rule="r", interval=iv, delta=0.02)
    with pytest.raises(ValueError, match="delta"):
        results.claim("x", "c", "m", paper=None, ours=1.0, rule="r", interval=iv, delta=-0.1, delta_reason="r")
    with pytest.raises(ValueError, match="verdict"):
        results.claim("x", "c", "m", paper=None, ours=1.0, rule="r", verdict="great", delta=0.1, delta_reason="r")


def test_decide_table_corners_and_edges():
    iv = lambda lo, hi: {"estimate": (lo + hi) / 2, "lo": lo, "hi": hi}
    d = 0.1
    assert results.decide(iv(0.05, 0.3), d) == "reproduced"        # real, can reach delta
    assert results.decide(iv(0.01, 0.05), d) == "partial"          # real, smaller than matters
    assert results.decide(iv(-0.05, 0.3), d) == "inconclusive"     # cannot tell
    assert results.decide(iv(-0.05, 0.05), d) == "not_reproduced"  # no effect that matters
    # edges: lo = 0 is not a real effect; hi = delta reaches delta
    assert results.decide(iv(0.0, 0.3), d) == "inconclusive" and results.decide(iv(0.0, 0.05), d) == "not_reproduced"
    assert results.decide(iv(0.01, 0.1), d) == "reproduced" and results.decide(iv(-0.01, 0.1), d) == "inconclusive"
    # lower is better: the interval is oriented (negated) first
    assert results.decide(iv(-0.3, -0.05), d, better="lower") == "reproduced"
    assert results.decide(iv(-0.05, -0.01), d, better="lower") == "partial"
    assert results.decide(iv(0.05, 0.3), d, better="lower") == "not_reproduced"
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="delta"):
            results.decide(iv(0.1, 0.2), bad)
    with pytest.raises(ValueError, match="better"):
        results.decide(iv(0.1, 0.2), d, better="up")
    # the size variant: inside the band, outside it, across an edge
    assert results.decide_size(iv(1.9, 2.1), 2.0, 0.2) == "reproduced"
    assert results.decide_size(iv(2.3, 2.5), 2.0, 0.2) == "not_reproduced"
    assert results.decide_size(iv(1.7, 1.9), 2.0, 0.2) == "inconclusive"
    assert results.decide_within(iv(-0.01, 0.3), low=-0.02) == "reproduced"     # non-inferiority, margin 0.02
    assert results.decide_within(iv(-0.05, -0.03), low=-0.02) == "not_reproduced"
    assert results.decide_within(iv(-0.05, 0.01), low=-0.02) == "inconclusive"
    assert results.all_of(["reproduced", "partial"]) == "partial"
    assert results.all_of(["reproduced", "inconclusive", "not_reproduced"]) == "not_reproduced"
    assert results.all_of(["reproduced", "not_run"]) == "not_run" and results.any_of(["partial", "reproduced"]) == "reproduced"


def test_gates():
    g_ok, g_bad = results.gate("ceiling recall", 0.95, 0.9), results.gate("fit error", 0.05, 1e-2, better="lower")
    assert g_ok["passed"] and not g_bad["passed"] and not results.gate("x", None, 1.0)["passed"]
    c = _claim(0.9, gates=[g_ok])
    assert c["verdict"] == "reproduced" and c["gates"] == [g_ok]
    c = _claim(0.9, gates=[g_ok, g_bad])
    assert c["verdict"] == "not_run" and c["gates"][1] == {"name": "fit error", "value": 0.05, "threshold": 0.01,
                                                          "better": "lower", "passed": False}
    doc = results.make_results("demo", PAPER, _Cfg(device="cpu"), [c], runtime_s=1.0)
    assert doc["claims"][0]["verdict"] == "not_run"
    bad = json.loads(json.dumps(doc))
    bad["claims"][0]["verdict"] = "reproduced"                    # a verdict past a failed gate is refused
    with pytest.raises(ValueError, match="passed"):
        results.validate_results(bad)
    md = report.claims_markdown([c])
    assert "fit error 0.05 <= 0.01 (FAILED)" in md and "**not run**" in md
    with pytest.raises(ValueError, match="better"):
        results.gate("x", 1.0, 0.5, better="more")


def test_provenance_and_staleness(tmp_path):
    import shutil
    from conftest import ROOT
    shutil.copytree(ROOT / "iclr25_repro" / "core", tmp_path / "iclr25_repro" / "core")
    (tmp_path / "iclr25_repro" / "demo").mkdir()
    (tmp_path / "iclr25_repro" / "demo" / "experiment.py").write_text("from iclr25_repro.core.results import claim\n")
    (tmp_path / "book").mkdir()
    doc = results.make_results("demo", PAPER, _Cfg.preset("full", device="cpu"), [_claim()], runtime_s=3.0,
                               root=tmp_path, command="python -m iclr25_repro experiment demo --scale full")
    prov = doc["provenance"]
    assert prov["key"] == results.source_key("demo", tmp_path) and prov["wall_s"] == 3.0
    assert prov["command"].endswith("--scale full") and prov["machine"]["cores"] >= 1
    assert not results.is_stale(doc, tmp_path)
    path = results.save_results(doc, tmp_path)
    assert results.committed_results("demo", tmp_path)["full"] == doc
    (tmp_path / "iclr25_repro" / "demo" / "experiment.py").write_text("# edited\n")
    assert results.is_stale(doc, tmp_path)
    (tmp_path / "iclr25_repro" / "demo" / "experiment.py").write_text("from iclr25_repro.core.results import claim\n")
    assert not results.is_stale(doc, tmp_path)
    (tmp_path / "iclr25_repro" / "core" / "results.py").write_text("# core's verdicts changed\n")
    assert results.is_stale(doc, tmp_path)                     # the results module is part of every key
    # a committed scale without provenance does not validate
    no_prov = {k: v for k, v in doc.items() if k != "provenance"}
    with pytest.raises(ValueError, match="provenance"):
        results.validate_results(no_prov)
    results.validate_results(dict(no_prov, scale="ci"))        # ci files are not committed: provenance optional


def test_scales_markdown_shows_committed_beside_ci(tmp_root):
    ci = results.make_results("usam", PAPER, _Cfg(device="cpu"), [_claim(0.86, half=0.02)], runtime_s=3.0)
    lap = results.make_results("usam", PAPER, _Cfg(scale="laptop", device="cpu"), [_claim(0.9)], runtime_s=900.0)
    md = report.scales_markdown(ci, committed={"laptop": lap})
    assert "| claim | paper | delta | ci | laptop | decided by |" in md
    assert "**inconclusive**" in md and "**reproduced**" in md and md.split("\n")[2].endswith("| laptop |")
    stale = json.loads(json.dumps(lap))
    stale["provenance"]["key"] = "0" * 64
    md = report.scales_markdown(ci, committed={"laptop": stale})
    assert "*stale*" in md and md.split("\n")[2].endswith("| ci |") and "**Stale**" in md


PAPER = {"title": "A paper", "arxiv": "2501.00001", "code": "https://github.com/example/code"}


def test_results_roundtrip(tmp_root):
    doc = results.make_results("demo", PAPER, _Cfg(device="cpu"), [_claim()], runtime_s=3.0)
    assert doc["device"].startswith("cpu") and doc["config"]["n"] == 10
    path = results.save_results(doc)
    assert path == tmp_root / "book" / "results" / "demo" / "ci.json"
    assert results.load_results(path) == json.loads(path.read_text())


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("claims"), "claims"),
    (lambda d: d.update(claims=[]), "claims"),
    (lambda d: d["claims"][0].update(verdict="sort of"), "verdict"),
    (lambda d: d["claims"][0].update(ours=None), "ours"),          # a verdict with no measurement
    (lambda d: d["claims"][0].update(delta=None), "delta"),        # a verdict with no smallest effect that matters
    (lambda d: d["claims"][0].update(delta_reason=""), "delta_reason"),
    (lambda d: d["claims"][0].update(extra=1), "extra"),
    (lambda d: d.update(scale="huge"), "scale"),
    (lambda d: d["paper"].update(arxiv="arXiv:2501"), "arxiv"),
    (lambda d: d.update(seeds=[]), "seeds"),
])
def test_schema_refuses(tmp_root, mutate, message):
    doc = results.make_results("demo", PAPER, _Cfg(device="cpu"), [_claim()], runtime_s=3.0)
    mutate(doc)
    with pytest.raises(ValueError, match=message):
        results.validate_results(doc)


def test_schema_file_in_sync():
    import jsonschema
    from conftest import ROOT
    on_disk = json.loads((ROOT / "book" / "results" / "schema.json").read_text())
    assert on_disk == results.RESULTS_SCHEMA, "regenerate: python -m iclr25_repro schema > book/results/schema.json"
    jsonschema.Draft202012Validator.check_schema(on_disk)


def test_committed_results_validate():
    from conftest import ROOT
    for path in (ROOT / "book" / "results").glob("*/full.json"):
        doc = results.load_results(path)
        assert doc["chapter"] == path.parent.name and doc["scale"] == "full"


# --- scorecard -----------------------------------------------------------------------------------
def test_scorecard(tmp_root):
    assert "No chapter has recorded results yet." in scorecard.scorecard_markdown({})
    results.save_results(results.make_results("demo", PAPER, _Cfg(device="cpu"), [_claim(0.5)], 3.0))
    full = _Cfg.preset("full", device="cpu")
    results.save_results(results.make_results("demo", PAPER, full, [_claim(0.9)], 300.0, device="cuda (test)"))
    found = scorecard.collect_results()
    assert set(found["demo"]) == {"ci", "full"}
    path = scorecard.write_scorecard()
    page = path.read_text()
    # decided by: full decides the one claim (reproduced)
    glance, per_scale = page.split("Every scale's own")[0], page.split("Every scale's own")[1]
    assert "| full | 1 | 1 | 0 | 0 | 0 | 0 |" in glance and "| ci | 0 | 0 | 0 | 0 | 0 | 0 |" in glance
    # scale, chapters, claims, reproduced, partial, inconclusive, not reproduced, not run
    assert "| ci | 1 | 1 | 0 | 0 | 0 | 1 | 0 |" in per_scale and "| full | 1 | 1 | 1 | 0 | 0 | 0 | 0 |" in per_scale
    assert "| ci | 1 | 0 | 0 | 0 |" in page                      # scale, chapters, checks, passed, failed
    assert "300 s on cuda (test)" in page
    assert (tmp_root / "book" / "scorecard.png").stat().st_size > 1000 and "scorecard.png" in page
    assert ":::{dropdown}" in page and "Rule: decide(interval of ours - baseline, delta = 0.02)" in page
    # the full result is stale once the chapter's code changes (here: a made-up key); then ci decides
    path = results.results_path("demo", "full")
    doc = json.loads(path.read_text())
    doc["provenance"]["key"] = "0" * 64
    path.write_text(json.dumps(doc))
    page = scorecard.write_scorecard().read_text()
    assert "| ci | 1 | 0 | 0 | 0 | 1 | 0 |" in page.split("Every scale's own")[0] and "*stale*" in page


def test_scorecard_counts_checks_apart(tmp_root):
    recs = [_claim(0.9), results.check("k1", "An identity holds.", "largest error", ours=1e-12, passed=True,
                                       rule="asserted: error < 1e-9"),
            results.check("k2", "A count matches.", "calls", ours=3, passed=False, rule="asserted: 4 calls")]
    results.save_results(results.make_results("demo", PAPER, _Cfg(device="cpu"), recs, 3.0))
    page = scorecard.write_scorecard().read_text()
    assert "| ci | 1 | 1 | 1 | 0 | 0 | 0 | 0 |" in page and "| ci | 1 | 2 | 1 | 1 |" in page   # one claim; two checks, one failed
    assert "No laptop or full run has been committed yet" in page
    assert "| **k2**: A count matches. *(calls)* | 3 | **failed** |" in page
    fig = scorecard.scorecard_figure(scorecard.collect_results())
    assert len(fig.axes) == 1                                          # one row per claim; checks are not drawn


def test_scorecard_refuses_misfiled_results(tmp_root):
    path = results.save_results(results.make_results("demo", PAPER, _Cfg(device="cpu"), [_claim()], 3.0))
    (path.parent.parent / "other").mkdir()
    path.rename(path.parent.parent / "other" / "ci.json")
    with pytest.raises(ValueError, match="says chapter"):
        scorecard.collect_results()


# --- runner --------------------------------------------------------------------------------------
def test_book_cell_tags():
    nb = {"cells": [
        {"cell_type": "code", "metadata": {}, "source": "#| default_exp a.b"},
        {"cell_type": "code", "metadata": {}, "source": ["#| export\n", "x = 1\n"]},
        {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": "#|hide\nscale = 'ci'"},
        {"cell_type": "code", "metadata": {}, "source": "#| echo: false\nplot()"},
        {"cell_type": "code", "metadata": {}, "source": "#| output: false\nfit()"},
        {"cell_type": "markdown", "metadata": {}, "source": "#| not a directive in markdown"},
    ]}
    cli.book_cell_tags(nb)
    tags = [c["metadata"].get("tags") for c in nb["cells"]]
    assert tags == [["remove-cell"], None, ["parameters", "remove-cell"], ["remove-input"], ["remove-output"], None]
    assert nb["cells"][1]["source"] == "x = 1"
    assert nb["cells"][5]["source"] == "#| not a directive in markdown"
    # what the reader did not come for: imports and the parameters hidden, the configuration collapsed
    nb = {"cells": [
        {"cell_type": "code", "metadata": {}, "source": "#| export\nfrom __future__ import annotations\nimport numpy as np"},
        {"cell_type": "code", "metadata": {}, "source": "import numpy as np\nnp.ones(3)"},
        {"cell_type": "code", "metadata": {"tags": ["injected-parameters"]}, "source": "scale = 'laptop'"},
        {"cell_type": "code", "metadata": {}, "source": "#| export\n@dataclass\nclass Config(ScaledConfig):\n    n: int = 1"},
        {"cell_type": "code", "metadata": {}, "source": "cfg = Config.preset(scale)"},
    ]}
    cli.book_cell_tags(nb)
    assert [c["metadata"].get("tags") for c in nb["cells"]] == [
        ["remove-cell"], None, ["injected-parameters", "remove-cell"], ["hide-input"], None]
    # an evaluation's exported code is collapsed; elsewhere (derivation, implementation) the code is the point
    ev = lambda: {"cells": [{"cell_type": "code", "metadata": {}, "source": "#| export\ndef make_claims(rows):\n    pass"}]}
    assert cli.book_cell_tags(ev(), collapse_exports=True)["cells"][0]["metadata"].get("tags") == ["hide-input"]
    assert cli.book_cell_tags(ev())["cells"][0]["metadata"].get("tags") is None


def test_chapter_discovery():
    slugs = cli.chapter_slugs()
    assert slugs[0] == "core"
    assert all(p.suffix == ".ipynb" for p in cli.chapter_notebooks("core"))
    with pytest.raises(ValueError, match="no chapter"):
        cli.chapter_notebooks("no_such_chapter")


def test_format_timings_flags_budget():
    rows = [{"notebook": "x/01.ipynb", "seconds": 60.0, "ok": True}, {"notebook": "x/02.ipynb", "seconds": 40.0, "ok": False}]
    table = cli.format_timings(rows, "ci")
    assert "OVER the 60 s ci budget" in table and "1 failed" in table
    assert "OVER" not in cli.format_timings(rows, "full")
    assert "OVER" not in cli.format_timings(rows, "ci", jobs=2, wall_s=50.0)      # at -j 2 a chapter shares the machine
    cached = [dict(r, ok=True, cached=True) for r in rows]
    table = cli.format_timings(cached, "ci", jobs=1, wall_s=0.1)
    assert "OVER" not in table and "(cached)" in table and "1 chapter(s) cached" in table


def test_cli_errors(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--scale", "huge"])
    with pytest.raises(ValueError, match="no experiment module"):
        cli.run_experiment("no_such_chapter", "tiny", "cpu")
    assert cli.main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == results.RESULTS_SCHEMA


def test_python_dash_m():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "iclr25_repro", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "experiment" in out.stdout


def test_explicit_root_wins_over_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ICLR25_REPRO_ROOT", str(tmp_path / "elsewhere"))
    assert results.repo_root() == tmp_path / "elsewhere"
    assert results.repo_root(tmp_path) == tmp_path
    assert results.results_path("demo", "ci", tmp_path) == tmp_path / "book" / "results" / "demo" / "ci.json"


def test_cleaning_keeps_parameters_tag_and_strips_outputs(tmp_path):
    from conftest import ROOT
    from nbdev.clean import _nbdev_clean
    nb = {"cells": [{"cell_type": "code", "id": "abcd1234", "metadata": {"tags": ["parameters"], "scrolled": True},
                     "source": ["scale = 'ci'"], "execution_count": 3,
                     "outputs": [{"output_type": "stream", "name": "stdout", "text": ["x"]}]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    from nbdev.config import get_config
    assert get_config().config_path == ROOT      # nbdev reads this repository's settings.ini (pytest runs in the root)
    _nbdev_clean(nb)
    assert nb["cells"][0]["metadata"] == {"tags": ["parameters"]}, "nbdev_clean dropped papermill's parameters tag"
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(nb))
    assert cli.strip_outputs(path) and not cli.strip_outputs(path)
    cell = json.loads(path.read_text())["cells"][0]
    assert cell["outputs"] == [] and cell["execution_count"] is None and cell["metadata"] == {"tags": ["parameters"]}


def _notebook(cells):
    return {"cells": [{"cell_type": "code", "id": f"c{i}", "metadata": md, "source": src, "outputs": [],
                       "execution_count": None} for i, (src, md) in enumerate(cells)],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "python3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def test_execute_notebook_injects_parameters_and_never_publishes_a_failure(tmp_path):
    (tmp_path / "nbs" / "demo").mkdir(parents=True)
    good = tmp_path / "nbs" / "demo" / "03_evaluation.ipynb"
    good.write_text(json.dumps(_notebook([
        ('scale = "ci"\ndevice = "auto"\nseed = 0', {"tags": ["parameters"]}),
        ("#| hide\nimport os", {}),
        ('print("scale is", scale, os.environ["HF_HUB_OFFLINE"])', {}),
    ])))
    row = cli.execute_notebook(good, "demo", scale="tiny", device="cpu", root=tmp_path)
    assert row["ok"], row["error"]
    out = json.loads((tmp_path / "book" / "demo" / "03_evaluation.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in out["cells"] for o in c.get("outputs", []))
    assert "scale is tiny 1" in printed                                  # papermill injected scale; kernel offline
    assert any("remove-cell" in c["metadata"].get("tags", []) and "".join(c["source"]) == "import os" for c in out["cells"])
    bad = tmp_path / "nbs" / "demo" / "04_broken.ipynb"
    bad.write_text(json.dumps(_notebook([("raise RuntimeError('boom')", {})])))
    (tmp_path / "book" / "demo" / "04_broken.ipynb").write_text("{}")   # a stale copy from an earlier build
    row = cli.execute_notebook(bad, "demo", root=tmp_path)
    assert not row["ok"] and "boom" in row["error"]
    assert not (tmp_path / "book" / "demo" / "04_broken.ipynb").exists()
    assert (tmp_path / ".cache" / "failed" / "demo" / "04_broken.ipynb").exists()


def test_run_experiment_writes_valid_results(tmp_path):
    doc = cli.run_experiment("parfam", scale="tiny", device="cpu", root=tmp_path)
    path = tmp_path / "book" / "results" / "parfam" / "tiny.json"
    assert results.load_results(path) == doc
    assert doc["details"] and all(c["verdict"] in (results.CHECK_VERDICTS if c["kind"] == "check" else results.VERDICTS)
                                  for c in doc["claims"])
    assert doc["env"]["git_sha"] is None or len(doc["env"]["git_sha"]) >= 40


def test_map_jobs_keeps_order_in_processes(monkeypatch):
    import os
    jobs = [dict(base=3, exp=k) for k in range(5)]
    before = os.environ.get("OMP_NUM_THREADS")
    monkeypatch.delenv("ICLR25_CPUS", raising=False)
    assert runtime.map_jobs(pow, jobs, n_workers=2) == [3 ** k for k in range(5)] == runtime.map_jobs(pow, jobs)
    assert os.environ.get("OMP_NUM_THREADS") == before
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="n_workers"):
            runtime.map_jobs(pow, jobs, n_workers=bad)


def test_map_jobs_respects_the_cpu_budget(monkeypatch):
    monkeypatch.setenv("ICLR25_CPUS", "1")          # what the runner sets for a kernel at -j 2 on 2 cores
    assert runtime.cpu_budget() == 1
    pid = runtime.map_jobs(_pid, [dict(x=k) for k in range(3)], n_workers=4)
    import os
    assert set(pid) == {os.getpid()}                # a budget of one: the jobs ran in this process
    monkeypatch.setenv("ICLR25_CPUS", "two")
    with pytest.raises(ValueError, match="ICLR25_CPUS"):
        runtime.cpu_budget()


def _pid(x):
    import os
    return os.getpid()


# --- claims, checks and intervals ----------------------------------------------------------------
def test_records_have_kinds_and_old_documents_say_what_to_add(tmp_root):
    k = results.check("k", "An identity holds.", "largest error", ours=1e-13, passed=True, rule="asserted: < 1e-10")
    assert k["kind"] == "check" and k["verdict"] == "passed"
    assert results.check("k", "c", "m", ours=2, passed=False, rule="r")["verdict"] == "failed"
    doc = results.make_results("demo", PAPER, _Cfg(device="cpu"), [_claim(), k], runtime_s=1.0)
    assert [c["kind"] for c in doc["claims"]] == ["claim", "check"]
    old = json.loads(json.dumps(doc))
    del old["claims"][0]["kind"]
    with pytest.raises(ValueError, match=r"no 'kind'. Add kind='claim'.*check\(\.\.\.\)"):
        results.validate_results(old)
    for mutate, message in [
        (lambda d: d["claims"][1].update(verdict="reproduced"), "passed"),      # a check cannot be 'reproduced'
        (lambda d: d["claims"][0].update(verdict="passed"), "reproduced"),      # nor a claim 'passed'
        (lambda d: d["claims"][0].update(kind="hunch"), "kind"),
        (lambda d: d["claims"][0].update(paper_tests="vibes"), "paper_tests"),
        (lambda d: d["claims"][0].update(replicates=0), "replicates"),
        (lambda d: d["claims"][0].update(interval={"lo": 0, "hi": 1}), "interval"),
        (lambda d: d["claims"][1].update(paper=0.5), "paper"),                  # a check has no paper number
    ]:
        bad = json.loads(json.dumps(doc))
        mutate(bad)
        with pytest.raises(ValueError, match=message):
            results.validate_results(bad)


def test_claim_carries_interval_replicates_and_paper_tests():
    iv = results.paired_interval([3.0, 4.0, 5.0, 4.5], [1.0, 1.5, 2.0, 2.5])
    c = results.claim("c", "Beats.", "m", paper=2.0, paper_tests="direction", ours=4.1, baseline=1.75, interval=iv,
                      ours_interval=(3.0, 5.0), rule="decide(interval, delta = 1)", delta=1.0, delta_reason="half the paper's 2")
    assert c["replicates"] == 4 and c["interval"]["n"] == 4 and c["ours_interval"] == [3.0, 5.0]
    assert c["verdict"] == "reproduced"
    with pytest.raises(ValueError, match="paper_tests"):
        results.claim("c", "c", "m", paper=None, paper_tests="size", ours=1.0, rule="r", verdict="reproduced", delta=1, delta_reason="r")
    with pytest.raises(ValueError, match="paper_tests"):
        results.claim("c", "c", "m", paper=1.0, paper_tests="roughly", ours=1.0, rule="r", verdict="reproduced", delta=1, delta_reason="r")
    with pytest.raises(ValueError, match="interval lacks"):
        results.claim("c", "c", "m", paper=None, ours=1.0, rule="r", delta=1, delta_reason="r", interval={"lo": 0})
    with pytest.raises(ValueError, match="ours_interval"):
        results.claim("c", "c", "m", paper=None, ours=1.0, rule="r", verdict="reproduced", delta=1, delta_reason="r", ours_interval=(2, 1))


def test_t_interval_against_the_formula():
    from scipy import stats
    x = np.array([0.12, -0.03, 0.08, 0.05, 0.10])
    iv = results.mean_interval(x, method="t", level=0.9)
    half = stats.t.ppf(0.95, 4) * x.std(ddof=1) / np.sqrt(5)
    assert iv["lo"] == pytest.approx(x.mean() - half, abs=1e-14) and iv["hi"] == pytest.approx(x.mean() + half, abs=1e-14)
    assert iv["method"] == "Student t, 4 df" and iv["level"] == 0.9 and iv["n"] == 5
    assert results.mean_interval(x)["method"] == "Student t, 4 df"                  # auto: t below 10 replicates
    assert results.mean_interval(np.arange(12.0))["method"].startswith("BCa bootstrap")
    same = results.mean_interval([2.0, 2.0, 2.0])
    assert same["lo"] == same["hi"] == 2.0 and "all replicates equal" in same["method"]
    for bad in ([1.0], [1.0, float("nan")], [[1.0, 2.0]]):
        with pytest.raises(ValueError):
            results.mean_interval(bad)
    with pytest.raises(ValueError, match="method"):
        results.mean_interval(x, method="jackknife")


def test_bca_interval_against_a_hand_computation():
    "BCa by hand (Efron and Tibshirani, ch. 14) from the same bootstrap distribution scipy draws with the same seed."
    from scipy import stats
    from scipy.special import ndtr, ndtri
    x = np.array([1.2, 0.4, 2.9, 1.1, 0.7, 3.8, 1.6, 0.9, 2.2, 1.3, 0.5, 5.1])
    iv = results.mean_interval(x, method="bca", seed=7)
    boot = stats.bootstrap((x,), np.mean, n_resamples=9999, method="BCa", rng=np.random.default_rng(7)).bootstrap_distribution
    theta = x.mean()
    z0 = ndtri(((boot < theta).sum() + (boot <= theta).sum()) / (2 * len(boot)))   # median bias, ties split
    jack = np.array([np.delete(x, i).mean() for i in range(len(x))])
    d = jack.mean() - jack
    a = (d ** 3).sum() / (6 * ((d ** 2).sum()) ** 1.5)                                # acceleration
    z = ndtri([0.025, 0.975])
    q = ndtr(z0 + (z0 + z) / (1 - a * (z0 + z)))
    lo, hi = np.percentile(boot, 100 * q)
    assert iv["lo"] == pytest.approx(lo, rel=1e-12) and iv["hi"] == pytest.approx(hi, rel=1e-12)
    assert results.mean_interval(x, method="bca", seed=7) == iv                     # seeded: the same interval again


def test_percentile_interval_against_the_exact_bootstrap():
    "For 5 points the bootstrap distribution of the mean is known exactly: every one of the 5^5 resamples."
    import itertools
    x = np.array([0.0, 1.0, 3.0, 4.0, 10.0])
    means = np.array([np.mean(c) for c in itertools.product(x, repeat=5)])
    lo, hi = np.quantile(means, [0.025, 0.975])
    iv = results.mean_interval(x, method="percentile", n_resamples=200_000)
    assert abs(iv["lo"] - lo) < 0.05 and abs(iv["hi"] - hi) < 0.05


def test_paired_interval_and_decide():
    a, b = np.array([5.0, 6.0, 7.5, 6.5]), np.array([4.0, 5.5, 6.0, 6.2])
    iv = results.paired_interval(a, b)
    ref = results.mean_interval(a - b)
    assert {k: iv[k] for k in ("lo", "hi", "estimate")} == {k: ref[k] for k in ("lo", "hi", "estimate")}
    assert "paired over 4 replicates" in iv["of"]
    lr = results.paired_interval(a, b, log=True)
    assert lr["estimate"] == pytest.approx(np.mean(np.log(a / b)))
    with pytest.raises(ValueError, match="same length"):
        results.paired_interval(a, b[:3])
    with pytest.raises(ValueError, match="positive"):
        results.paired_interval(a, -b, log=True)
    above = {"estimate": 1.0, "lo": 0.2, "hi": 1.8}
    across = {"estimate": 1.0, "lo": -0.2, "hi": 2.2}
    below = {"estimate": -1.0, "lo": -2.0, "hi": 0.5}
    assert results.decide(across, 0.5) == "inconclusive" and results.decide(above, 0.5) == "reproduced"
    assert results.decide(below, 0.5) == "inconclusive" and results.decide(below, 0.6) == "not_reproduced"
    assert results.decide(below, 0.5, better="lower") == "inconclusive"
    assert results.decide({"estimate": 0.5, "lo": 0.0, "hi": 1.0}, 0.5) == "inconclusive"   # touching 0 is not above it


# --- prose from the run --------------------------------------------------------------------------
def test_closing_section_and_say():
    from iclr25_repro.core import report
    assert str(report.say("{x} and {iv} and {p:.1%}", x=0.123456, iv={"estimate": 1.0, "lo": 0.5, "hi": 1.5},
                          p=0.25)) == "0.123 and 1 [0.5, 1.5] and 25.0%"
    assert str(report.say("{x}", x=np.float32(2.5))) == "2.5" and str(report.say("{n}", n=3)) == "3"
    iv = results.paired_interval([2.0, 2.1, 2.2], [1.0, 1.0, 1.0])
    recs = [results.claim("C1", "Beats.", "score", paper=3.0, paper_tests="size", ours=3.0, baseline=1.0, interval=iv,
                          rule="r", delta=0.5, delta_reason="half the paper's gain"),
            results.claim("C2", "Scales.", "slope", paper=None, ours=None, rule="r", delta=0.1, delta_reason="r"),
            results.check("K1", "Holds.", "error", ours=0.0, passed=True, rule="r")]
    md = report.closing_section(recs, {"C1": "Because.", "C2": "Too small at ci."}, scale="ci", outro="The end.")
    text = str(md)
    assert text.startswith("Of 2 claims tested at scale ci: 1 reproduced, 1 not run. 1 check")
    assert "- **C1, reproduced.** Beats. Paper: 3 (the rule tests its size)." in text and "Because." in text
    assert "- **C2, not run.**" in text and "- **K1, a check, passed.**" in text and text.rstrip().endswith("The end.")
    assert md._repr_markdown_() == text
    with pytest.raises(ValueError, match="missing"):
        report.closing_section(recs, {"C1": "Because."})
    with pytest.raises(ValueError, match="do not exist"):
        report.closing_section(recs, {"C1": "a", "C2": "b", "C3": "c"})


# --- the runner: cache, parallel chapters, smoke and dry runs ------------------------------------
def _fake_book(root, slugs=("alpha", "beta")):
    "A repository root with tiny chapters: each writes a results file from a seeded computation and prints its threads."
    code = ("import json, os, numpy as np, torch\n"
            "from dataclasses import dataclass\n"
            "from iclr25_repro.core.results import check, claim, make_results, save_results\n"
            "from iclr25_repro.core.runtime import ScaledConfig\n"
            "@dataclass\nclass C(ScaledConfig):\n    pass\n"
            "x = torch.randn(64, 64, generator=torch.Generator().manual_seed(seed))\n"
            "v = float((x @ x.T).trace()) + float(np.random.default_rng(seed).normal())\n"
            "print('threads', torch.get_num_threads(), os.environ.get('ICLR25_CPUS'))\n"
            "doc = make_results(SLUG, {'title': 't', 'arxiv': '2501.00001', 'code': None}, C(scale=scale, device='cpu'),\n"
            "                   [claim('c', 'c', 'm', paper=None, ours=v, rule='r', verdict='reproduced' if v > 0 else 'not_reproduced', delta=1.0, delta_reason='r')], 1.0)\n"
            "save_results(doc)\n")
    for s in slugs:
        (root / "nbs" / s).mkdir(parents=True)
        (root / "iclr25_repro" / s).mkdir(parents=True)
        (root / "iclr25_repro" / s / "mod.py").write_text("X = 1\n")
        (root / "nbs" / s / "03_evaluation.ipynb").write_text(json.dumps(_notebook([
            ('scale = "ci"\ndevice = "auto"\nseed = 0', {"tags": ["parameters"]}),
            (f"SLUG = {s!r}\n" + code, {}),
        ])))
    (root / "iclr25_repro" / "core").mkdir(parents=True)
    (root / "iclr25_repro" / "core" / "x.py").write_text("Y = 1\n")
    (root / "book").mkdir(exist_ok=True)


def _executed(capsys) -> set[str]:
    out = capsys.readouterr().out
    return {line.split()[1].split("/")[0] for line in out.splitlines() if line.startswith("  ok ")}


def test_cache_reexecutes_exactly_the_changed_chapter(tmp_path, capsys):
    _fake_book(tmp_path)
    run = lambda **kw: cli.run_book(["alpha", "beta"], "tiny", "cpu", 0, root=tmp_path, jobs=1, **kw)
    run()
    assert _executed(capsys) == {"alpha", "beta"}
    rows = run()
    assert _executed(capsys) == set() and all(r.get("cached") for r in rows)
    (tmp_path / "iclr25_repro" / "beta" / "mod.py").write_text("X = 2\n")          # one chapter's package source
    run()
    assert _executed(capsys) == {"beta"}
    (tmp_path / "iclr25_repro" / "core" / "x.py").write_text("Y = 2\n")            # core: every chapter
    run()
    assert _executed(capsys) == {"alpha", "beta"}
    (tmp_path / "book" / "alpha" / "03_evaluation.ipynb").unlink()                  # a lost output is rebuilt
    run()
    assert _executed(capsys) == {"alpha"}
    cli.run_book(["beta"], "tiny", "cpu", 1, root=tmp_path, jobs=1)                  # another seed: another key
    assert _executed(capsys) == {"beta"}
    run(force=True)
    assert _executed(capsys) == {"alpha", "beta"}


def test_cache_key_covers_inputs_and_versions(tmp_path, monkeypatch):
    _fake_book(tmp_path)
    key = cli.chapter_key("alpha", "ci", "cpu", 0, tmp_path)
    (tmp_path / "iclr25_repro" / "_modidx.py").write_text("d = {}\n")               # nbdev's index: not an input
    assert cli.chapter_key("alpha", "ci", "cpu", 0, tmp_path) == key
    assert cli.chapter_key("alpha", "full", "cpu", 0, tmp_path) != key
    (tmp_path / "nbs" / "alpha" / "data.csv").write_text("1,2\n")                   # any file of the chapter's folder
    assert cli.chapter_key("alpha", "ci", "cpu", 0, tmp_path) != key
    key = cli.chapter_key("alpha", "ci", "cpu", 0, tmp_path)
    (tmp_path / "constraints.txt").write_text("torch==2.13.0\n")
    monkeypatch.setattr(cli, "installed_versions", lambda root=None: {"torch": "9.9"})
    assert cli.chapter_key("alpha", "ci", "cpu", 0, tmp_path) != key
    (tmp_path / "iclr25_repro" / "alpha" / "mod.py").write_text("from ..beta import mod\n")   # alpha now uses beta
    assert any(p.parent.name == "beta" for p in cli.chapter_inputs("alpha", tmp_path))
    assert cli._requirement_names(tmp_path) == ["torch"]


def test_parallel_run_gives_the_same_results_files(tmp_path, capsys):
    def files(root):
        out = {}
        for p in sorted((root / "book" / "results").glob("*/tiny.json")):
            d = json.loads(p.read_text())
            d.pop("runtime_s"), d["env"].pop("utc"), d.pop("device")   # provenance: when, how long, on how many threads
            d["provenance"].pop("wall_s"), d["provenance"].pop("machine")
            out[p.parent.name] = d
        return out
    one, two = tmp_path / "one", tmp_path / "two"
    _fake_book(one)
    _fake_book(two)
    cli.run_book(None, "tiny", "cpu", 0, root=one, jobs=1)
    cli.run_book(None, "tiny", "cpu", 0, root=two, jobs=2)
    assert "at -j 2" in capsys.readouterr().out
    assert files(one) == files(two) and set(files(one)) == {"alpha", "beta"}
    printed = lambda root: "".join("".join(o.get("text", "")) for c in json.loads(
        (root / "book" / "alpha" / "03_evaluation.ipynb").read_text())["cells"] for o in c.get("outputs", []))
    import os
    cores = len(os.sched_getaffinity(0))
    assert f"threads {cores} {cores}" in printed(one)                      # -j 1: the chapter has every core
    assert f"threads {max(1, cores // 2)} {max(1, cores // 2)}" in printed(two)   # -j 2: half each, never more


def test_smoke_and_dry_run(tmp_root, capsys):
    assert cli.main(["experiment", "usam", "--scale", "full", "--smoke"]) == 0
    out = capsys.readouterr().out
    assert "smoke run: nothing written" in out and not (tmp_root / "book" / "results").exists()
    assert cli.main(["experiment", "usam", "--scale", "full", "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "usam at scale full" in plan and "(* differs from ci)" in plan
    with pytest.raises(ValueError, match="SMOKE is empty"):
        _Cfg.preset("full", smoke=True)


def test_dry_run_reports_a_current_committed_run():
    "Where a committed result of the same scale ran this very code, --dry-run prints its wall time; a stale one never."
    from iclr25_repro.core.results import committed_results, is_stale
    for slug in ("sst", "ross"):
        done = committed_results(slug).get("laptop")
        text = cli.dry_run(slug, "laptop", measure=False)
        if done is None or is_stale(done):
            assert "measured:" not in text
        else:
            assert f"measured: the committed laptop run of this code took {float(done['runtime_s']):.0f} s" in text
            assert ("OVER the 1200 s budget" in text.splitlines()[-1]) == (float(done["runtime_s"]) > 1200)


@dataclass
class _LapCfg(runtime.ScaledConfig):
    steps: int = 10
    sizes: tuple = (1, 2)
    PRESETS: ClassVar[dict] = {"ci": {}, "laptop": dict(steps=400), "full": dict(steps=1000)}
    SMOKE: ClassVar[dict] = {"steps": 1}


def test_laptop_estimate_is_calibrated_by_the_committed_run(monkeypatch):
    "The laptop estimate scales the committed laptop run's seconds per unit to the preset's units, whatever the smoke run says."
    import types
    fake = types.SimpleNamespace(Config=_LapCfg, plan=lambda cfg: [{"phase": "train", "units": cfg.steps * sum(cfg.sizes)}],
                                 run=lambda cfg: pytest.fail("a committed run calibrates the estimate: no smoke run"))
    committed = {"laptop": {"chapter": "demo", "scale": "laptop", "runtime_s": 60.0, "provenance": {"key": "old"},
                            "config": {**_LapCfg.preset("laptop").to_dict(), "steps": 200, "sizes": [1, 2]}}}
    monkeypatch.setattr(cli, "experiment_module", lambda slug: fake)
    monkeypatch.setattr(cli, "committed_results", lambda slug, root=None: committed)
    prior = cli.prior_rate("demo", "laptop")
    assert prior["units"] == 600 and prior["wall"] == 60.0 and prior["stale"]
    est = cli.estimate_wall("demo", "laptop")          # the preset has twice the committed run's steps: twice its time
    assert est["units"] == 1200 and est["seconds"] == pytest.approx(120.0) and "code has changed since" in est["assumes"]
    committed["laptop"]["config"]["steps"] = "many"    # a config the code can no longer count: the smoke run decides
    monkeypatch.setattr(fake, "plan", lambda cfg: [{"units": float(cfg.steps) * 3}])
    assert cli.prior_rate("demo", "laptop") is None
    assert cli.estimate_wall("demo", "laptop", measure=False)["assumes"] == "not measured"
