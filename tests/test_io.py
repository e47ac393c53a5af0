"""Atomic writes and crash-tolerant JSONL (workbench.core.io)."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from workbench.core import io as wio


def _listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


# ---------------------------------------------------------------- atomic whole-file writes


def test_atomic_write_text_creates_and_replaces(tmp_path):
    target = tmp_path / "a.txt"
    wio.atomic_write_text(target, "old")
    wio.atomic_write_text(target, "new é")
    assert target.read_text(encoding="utf-8") == "new é"
    assert _listing(tmp_path) == ["a.txt"]


def test_failed_replace_keeps_old_content_and_leaves_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "a.json"
    wio.atomic_write_json(target, {"v": 1})

    def broken_replace(src, dst):
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="simulated"):
        wio.atomic_write_json(target, {"v": 2})
    assert json.loads(target.read_text()) == {"v": 1}
    assert _listing(tmp_path) == ["a.json"]


def test_failure_while_writing_keeps_old_file(tmp_path):
    target = tmp_path / "obj.bin"
    wio.atomic_write_bytes(target, b"old")
    with pytest.raises(TypeError):  # a str into the binary temp file fails inside the write
        wio.atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert _listing(tmp_path) == ["obj.bin"]


def test_json_and_yaml_round_trip(tmp_path):
    obj = {"b": [1, 2.5, "x"], "a": {"nested": None}, "nan": math.nan}
    wio.atomic_write_json(tmp_path / "o.json", obj)
    back = json.loads((tmp_path / "o.json").read_text())
    assert back["b"] == obj["b"] and back["a"] == obj["a"] and math.isnan(back["nan"])
    cfg = {"z": 1, "a": [0.1, 2], "s": "t"}
    wio.atomic_write_yaml(tmp_path / "c.yaml", cfg)
    text = (tmp_path / "c.yaml").read_text()
    assert yaml.safe_load(text) == cfg
    assert text.index("z:") < text.index("a:")  # key order kept


def test_atomic_write_bytes(tmp_path):
    wio.atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"


# ---------------------------------------------------------------- JSONL


def test_append_and_read_jsonl(tmp_path):
    path = tmp_path / "m.jsonl"
    for i in range(3):
        wio.append_jsonl(path, {"step": i, "x": i / 2})
    assert wio.read_jsonl(path) == [{"step": i, "x": i / 2} for i in range(3)]
    with pytest.raises(TypeError, match="must be a dict"):
        wio.append_jsonl(path, [1, 2])


def test_partial_last_line_is_skipped_with_warning(tmp_path, caplog):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "x": 0.12')
    with caplog.at_level(logging.WARNING, logger="workbench.core.io"):
        rows = wio.read_jsonl(path)
    assert rows == [{"step": 0}, {"step": 1}]
    assert "partial last line 3" in caplog.text and "m.jsonl" in caplog.text
    with pytest.raises(ValueError, match="line 3"):
        wio.read_jsonl(path, skip_partial_last=False)


def test_corrupt_middle_line_raises_naming_file_and_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, oops\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl: line 2"):
        wio.read_jsonl(path)


def test_non_object_line_is_rejected(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('[1, 2]\n{"step": 1}\n')
    with pytest.raises(ValueError, match="line 1 is not a JSON object"):
        wio.read_jsonl(path)


def test_append_after_partial_line_repairs_the_tail(tmp_path, caplog):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, "x": 0.1')
    with caplog.at_level(logging.WARNING, logger="workbench.core.io"):
        wio.append_jsonl(path, {"step": 1, "x": 0.5})
    assert "dropping a partial last line" in caplog.text
    assert wio.read_jsonl(path, skip_partial_last=False) == [{"step": 0}, {"step": 1, "x": 0.5}]


def test_complete_last_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}')
    assert wio.read_jsonl(path) == [{"step": 0}, {"step": 1}]
    wio.append_jsonl(path, {"step": 2})
    assert wio.read_jsonl(path, skip_partial_last=False) == [{"step": 0}, {"step": 1}, {"step": 2}]


def test_truncate_jsonl(tmp_path):
    path = tmp_path / "m.jsonl"
    for i in range(5):
        wio.append_jsonl(path, {"step": i})
    with path.open("a") as f:
        f.write('{"step": 5')  # a partial line goes too
    assert wio.truncate_jsonl(path, lambda r: r["step"] <= 2) == 2
    assert wio.read_jsonl(path, skip_partial_last=False) == [{"step": i} for i in range(3)]
    assert wio.truncate_jsonl(tmp_path / "missing.jsonl", lambda r: True) == 0
    assert not (tmp_path / "missing.jsonl").exists()


_APPENDER = textwrap.dedent(
    """
    import sys
    from workbench.core.io import append_jsonl
    i = 0
    while True:
        append_jsonl(sys.argv[1], {"i": i, "pad": "x" * 3000})
        i += 1
    """
)


def test_kill_minus_9_mid_append_leaves_a_readable_log(tmp_path):
    path = tmp_path / "m.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", _APPENDER, str(path)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size > 200_000:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the appender subprocess never wrote enough")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    rows = wio.read_jsonl(path)
    assert len(rows) >= 50
    assert [r["i"] for r in rows] == list(range(len(rows)))
    wio.append_jsonl(path, {"i": len(rows)})  # the log keeps working after the kill
    assert [r["i"] for r in wio.read_jsonl(path, skip_partial_last=False)] == list(range(len(rows) + 1))


# ---------------------------------------------------------------- conversions


def test_to_float_accepts_scalars_and_names_bad_values():
    assert wio.to_float(np.float32(0.5), "k") == 0.5
    assert wio.to_float(torch.tensor(2.0), "k") == 2.0
    assert wio.to_float(torch.tensor([3]), "k") == 3.0
    assert wio.to_float(True, "k") == 1.0
    with pytest.raises(TypeError, match="loss/a"):
        wio.to_float(torch.zeros(2), "loss/a")
    with pytest.raises(TypeError, match="str"):
        wio.to_float("0.5", "k")


def test_to_plain_normalises_and_names_the_bad_path():
    cfg = {"a": (1, 2), "p": Path("/x"), "n": np.int64(3), "t": torch.tensor(0.25)}
    assert wio.to_plain(cfg) == {"a": [1, 2], "p": "/x", "n": 3, "t": 0.25}
    with pytest.raises(TypeError, match=r"config\.agents\[1\]\.bad"):
        wio.to_plain({"agents": [{}, {"bad": object()}]})
    with pytest.raises(TypeError, match="keys must be str"):
        wio.to_plain({1: 2})


def test_to_jsonable_is_lenient():
    out = wio.to_jsonable({"t": torch.tensor([1.0, 2.0]), "s": {3}, 4: Path("p")})
    assert out == {"t": [1.0, 2.0], "s": [3], "4": "p"}
