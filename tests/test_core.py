"""Tests of iclr25_repro.core: devices, seeds, presets, results, scorecard and runner helpers."""
import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch

from iclr25_repro.core import cli, results, runtime, scorecard


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
def _claim(ours=0.9, **kw):
    return results.claim("acc", "Beats the baseline.", "accuracy", paper=0.91, ours=ours, baseline=0.85,
                         rule="reproduced if ours > baseline + 0.02; partial if ours > baseline",
                         reproduced=ours is not None and ours > 0.87, partial=ours is not None and ours > 0.85, **kw)


def test_claim_verdicts():
    assert _claim(0.9)["verdict"] == "reproduced"
    assert _claim(0.86)["verdict"] == "partial"
    assert _claim(0.5)["verdict"] == "not_reproduced"
    assert _claim(None)["verdict"] == "not_run"
    assert _claim(np.float32(0.9))["ours"] == pytest.approx(0.9)
    assert results.claim("x", "c", "m", paper=None, ours=float("nan"), rule="r", reproduced=True)["verdict"] == "not_run"
    with pytest.raises(ValueError, match="rule"):
        results.claim("x", "c", "m", paper=None, ours=1.0, rule="", reproduced=True)


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
    assert "| ci | 0 | 0 | 1 | 0 |" in page and "| full | 1 | 0 | 0 | 0 |" in page
    assert "300 s on cuda (test)" in page


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


def test_chapter_discovery():
    slugs = cli.chapter_slugs()
    assert slugs[0] == "core"
    assert all(p.suffix == ".ipynb" for p in cli.chapter_notebooks("core"))
    with pytest.raises(ValueError, match="no chapter"):
        cli.chapter_notebooks("no_such_chapter")


def test_format_timings_flags_budget():
    rows = [{"notebook": "x/01.ipynb", "seconds": 60.0, "ok": True}, {"notebook": "x/02.ipynb", "seconds": 40.0, "ok": False}]
    table = cli.format_timings(rows, "ci")
    assert "OVER the 90 s ci budget" in table and "1 failed" in table
    assert "OVER" not in cli.format_timings(rows, "full")


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
    assert doc["details"] and all(c["verdict"] in results.VERDICTS for c in doc["claims"])
    assert doc["env"]["git_sha"] is None or len(doc["env"]["git_sha"]) >= 40


def test_map_jobs_keeps_order_in_processes():
    import os
    jobs = [dict(base=3, exp=k) for k in range(5)]
    before = os.environ.get("OMP_NUM_THREADS")
    assert runtime.map_jobs(pow, jobs, n_workers=2) == [3 ** k for k in range(5)] == runtime.map_jobs(pow, jobs)
    assert os.environ.get("OMP_NUM_THREADS") == before
    with pytest.raises(ValueError, match="n_workers"):
        runtime.map_jobs(pow, jobs, n_workers=0)
