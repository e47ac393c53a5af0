"""Heavy dependencies stay at the edges: the math imports torch only (style principle 14)."""

import subprocess
import sys

HEAVY = ["transformers", "peft", "bitsandbytes", "altair", "ipywidgets", "papermill"]


def test_math_modules_import_no_heavy_dependency():
    code = (
        "import sys, workbench.hacpo, workbench.types\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"workbench.hacpo pulled in: {out.stdout.strip()}"
