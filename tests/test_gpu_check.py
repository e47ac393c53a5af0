"""``bench/gpu_check.py`` runs end to end at toy sizes on CPU (``--tiny --device cpu``), so the one script a
GPU machine will run has run before it gets there."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_script_runs_end_to_end_on_cpu(tmp_path, hacpo_cache):
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--tiny", "--device", "cpu", "--out", str(tmp_path),
         "--max-new-tokens", "6"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    run = report["standin"]
    # random weights never stop early: 2 agents x 4 rows x the 6 new tokens asked for (the tiny size has 8)
    assert [(row["step"], row["generated_tokens"]) for row in run["steps"]] == [(1, 48), (2, 48)]
    assert run["rollout_rows"] == {"qwen3-1.7b-shape": 4, "qwen3-tiny": 4}  # the plan sized the batches
    # the length-parity reward gives advantages, so the update runs (a math reward is 0 for random weights)
    assert any(row[key] != 0 for row in run["steps"] for key in row if key.startswith("loss/"))
    assert run["decode"]["compiled_tok_s"] > 0 and run["decode"]["greedy_tokens_equal"] == "32/32"
    engine = run["engine"]  # served by vLLM where `make engine` built its environment, else skipped with why
    assert "make engine" in engine["skipped"] if "skipped" in engine else engine["engine_size_tok_s"] > 0
    if "skipped" not in engine:
        assert engine["gap_mean"] < 1e-3 and engine["sync_s"] > 0
    text = (tmp_path / "report.md").read_text()
    assert "2 HACPO steps at 6 new tokens" in text
    assert "script OK" in text and "nothing here was measured on a GPU" in text
    assert "## vLLM engine" in text
