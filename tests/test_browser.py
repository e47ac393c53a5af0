"""Every notebook opened in JupyterLab in a real headless browser, run with "Run All Cells", no error output.

This is what a person does (``make lab``, open a notebook, run it), and it catches what papermill from the
project root cannot: the kernel JupyterLab starts runs in the notebook's own folder. Each notebook is copied
with papermill's parameters injected (smoke sizes, outputs under a temporary folder) into a folder outside
the project, JupyterLab serves that folder, and playwright drives Debian's chromium: open the notebook, run
every cell from the command palette, wait until every cell has run, save, and read the saved file's outputs.

Skipped, with the reason printed in pytest's summary, when chromium or playwright is missing (CI does not
install the ≈480 MB browser; ``make test-browser`` runs this file).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from papermill.iorw import load_notebook_node
from papermill.parameterize import parameterize_notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CELL_TIMEOUT_S = 900

pytestmark = pytest.mark.slow


def _skip_reason() -> str | None:
    if CHROMIUM is None:
        return "browser test skipped: no chromium on PATH (apt-get install -y chromium, ≈480 MB)"
    if importlib.util.find_spec("playwright") is None:
        return (
            "browser test skipped: playwright is not installed (pip install playwright; no browser download)"
        )
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parameters(path: Path, work: Path) -> dict:
    """Smoke sizes and every output under ``work`` (the runs shared, so 05 finds what 01-04 trained)."""
    params = {"smoke": True, "out_dir": str(work / "out" / path.stem), "results_root": str(work / "runs")}
    if path.stem[:2] in ("01", "03", "04"):
        params["seeds"] = [0]
    if path.stem.startswith("02"):
        params["results_root"] = str(work / "tune-runs")
    return params


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, hacpo_cache: Path):
    """JupyterLab serving parameterized copies of the notebooks from a folder outside the project."""
    reason = _skip_reason()
    if reason:
        print(reason)
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("lab")
    (work / "notebooks").mkdir()
    for path in NOTEBOOKS:
        nb = parameterize_notebook(load_notebook_node(str(path)), _parameters(path, work))
        nbformat.write(nb, work / "notebooks" / path.name)
    port, token = _free_port(), secrets.token_hex(16)
    command = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
        f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}",
        "--LabApp.news_url=", "--ServerApp.open_browser=False",
    ]  # fmt: skip
    log = open(work / "jupyter.log", "w")  # noqa: SIM115 (closed at teardown)
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).close()
            break
        time.sleep(0.5)
    else:
        server.terminate()
        pytest.fail(f"JupyterLab did not start: {(work / 'jupyter.log').read_text()[-2000:]}")
    yield {"base": base, "token": token, "work": work}
    server.terminate()
    server.wait(timeout=30)
    log.close()


def _shut_down_kernels(lab: dict) -> None:
    """Free the memory of the kernels the notebook left running (the next notebook starts its own)."""
    url = f"{lab['base']}/api/kernels?token={lab['token']}"
    for kernel in json.loads(urllib.request.urlopen(url, timeout=10).read()):
        request = urllib.request.Request(
            f"{lab['base']}/api/kernels/{kernel['id']}?token={lab['token']}", method="DELETE"
        )
        urllib.request.urlopen(request, timeout=30).close()


def _kernel_idle(page) -> bool:
    """The status bar reads "HACPO workbench | Idle" (the kernel is connected, not merely the page)."""
    return any("HACPO workbench | Idle" in t for t in page.locator(".jp-StatusBar-Widget").all_inner_texts())


def _saved_cells(page, path: Path) -> list[dict]:
    """Save (Ctrl+S) and read the notebook's code cells back from disk."""
    page.locator(".jp-Notebook:visible").first.click(position={"x": 5, "y": 5})
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    time.sleep(2)
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def _run_all(page, path: Path) -> list[dict]:
    """Menu Run → "Run All Cells" once the kernel is idle; wait until every code cell of the saved file has an
    execution count (JupyterLab renders only the cells in view, so the page alone cannot tell)."""
    deadline = time.monotonic() + 120
    while not _kernel_idle(page):
        assert time.monotonic() < deadline, (
            f"kernel not idle: {page.locator('.jp-StatusBar-Widget').all_inner_texts()}"
        )
        time.sleep(0.5)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    deadline = time.monotonic() + CELL_TIMEOUT_S
    while time.monotonic() < deadline:
        time.sleep(5)
        running = any("*" in p for p in page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts())
        if _kernel_idle(page) and not running:
            cells = _saved_cells(page, path)
            if all(c.get("execution_count") for c in cells):
                return cells
    raise AssertionError(f"cells still running after {CELL_TIMEOUT_S} s")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_jupyterlab(lab, path):
    from playwright.sync_api import sync_playwright

    saved = lab["work"] / "notebooks" / path.name
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        # ?reset: a fresh workspace, so only this notebook is open (not the ones of the tests before)
        page.goto(f"{lab['base']}/lab/tree/notebooks/{path.name}?reset&token={lab['token']}")
        page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=60_000)
        start = time.perf_counter()
        cells = _run_all(page, saved)
        seconds = time.perf_counter() - start
        page.mouse.move(700, 500)
        page.mouse.wheel(0, -1_000_000)  # back to the top: the tuning panel is rendered when in view
        time.sleep(3)
        sliders = page.locator(".widget-hslider").count()
        stderr = page.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']")
        tracebacks = [t for t in stderr.all_inner_texts() if "Traceback" in t]
        browser.close()
    _shut_down_kernels(lab)
    outputs = [o for c in cells for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    svgs = sum("image/svg+xml" in o.get("data", {}) or "<svg" in str(o.get("data", {})) for o in outputs)
    print(
        f"{path.name}: {len(cells)} code cells run in {seconds:.0f} s, {len(errors)} error outputs, "
        f"{svgs} outputs with SVG charts, {sliders} sliders rendered at the top",
        flush=True,
    )
    assert not errors, "\n".join(f"{e['ename']}: {e['evalue']}" for e in errors)
    assert not tracebacks, tracebacks[0][:2000]
    if path.stem.startswith("02"):
        assert sliders >= 7, "the tuning panel's sliders did not render"
