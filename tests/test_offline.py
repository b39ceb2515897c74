"""A notebook executes with the network unavailable (its own network namespace: loopback only)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

UNSHARE = shutil.which("unshare")


def _offline(cmd: str, **kw) -> subprocess.CompletedProcess:
    "Run shell command `cmd` in a new network namespace that has only the loopback interface."
    return subprocess.run([UNSHARE, "-n", "sh", "-c", f"ip link set lo up && {cmd}"], capture_output=True, text=True, **kw)


def _namespace_available() -> str | None:
    if UNSHARE is None or shutil.which("ip") is None:
        return "unshare or ip is not installed"
    r = _offline("true")
    return None if r.returncode == 0 else f"cannot create a network namespace here: {r.stderr.strip()[:200]}"


def _offline_notebook() -> tuple[Path, list[str]]:
    "The notebook to run offline: the first chapter's evaluation at scale tiny, else a core notebook."
    evals = sorted(p for p in (ROOT / "nbs").glob("*/*evaluation*.ipynb") if p.parent.name != "core")
    if evals:
        return evals[0], ["-p", "scale", "tiny", "-p", "device", "cpu"]
    return ROOT / "nbs" / "core" / "02_results.ipynb", []


def test_notebook_runs_without_network(tmp_path):
    reason = _namespace_available()
    if reason:
        pytest.skip(reason)
    probe = _offline(f"{sys.executable} -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"")
    assert probe.returncode != 0, "the namespace still reaches the network; the test would prove nothing"
    nb, params = _offline_notebook()
    out = tmp_path / "out.ipynb"
    (tmp_path / "book").mkdir()
    env = dict(os.environ, ICLR25_REPRO_ROOT=str(tmp_path), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", ICLR25_QUIET="1")
    papermill = str(Path(sys.executable).parent / "papermill")
    cmd = " ".join([papermill, str(nb), str(out), "-k", "python3", "--cwd", str(nb.parent), "--no-progress-bar", *params])
    r = _offline(cmd, env=env, timeout=600)
    assert r.returncode == 0, f"{nb.name} failed offline:\n{r.stderr[-3000:]}"
    executed = json.loads(out.read_text())
    assert all(not any(o.get("output_type") == "error" for o in c.get("outputs", [])) for c in executed["cells"])
