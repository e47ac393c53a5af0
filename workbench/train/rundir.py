"""Run directories: creating them, writing into them, and loading any set of them into pandas.

A run directory is ``results/<experiment>/<run-id>/`` and holds (the contract shared with the trainer,
plots, tables and notebooks; metric keys are documented in ``docs/metrics.md``):

| file | written by | content |
|---|---|---|
| ``config.yaml`` | `RunWriter.write_config` (first) | the resolved experiment config |
| ``environment.json`` | `RunWriter.write_environment` | versions, CPU, threads, device, git commit, start, |
| | `RunWriter.record_start` | starting-weights digests; each resume's own entry under ``resumes`` |
| ``metrics.jsonl`` | `RunWriter.log_metrics` | ``{"step": 3, "<namespaced key>": float, ...}`` per line |
| ``evals.csv`` | `RunWriter.append_evals` | ``step, agent, benchmark, metric, value`` |
| ``eval_items.csv`` | `RunWriter.append_eval_items` | ``step, agent, benchmark, item, greedy, sampled, k`` |
| ``samples/step_000003.jsonl`` | `RunWriter.write_samples` | a sample of rollouts of that step |
| ``checkpoints/`` | `workbench.train.checkpoint` | ``step_000010/`` dirs + ``latest`` pointer |
| ``DONE`` | `RunWriter.mark_done` | JSON summary; the run finished |
| ``.run.lock`` | `workbench.train.run.train` | held while a process writes the run: its pid, host, start |

Every write is atomic (`workbench.core.io`); `create_run_dir` makes the directory exclusively, so two runs
never share one, and `train` holds the run's lock (`workbench.core.lock`) while it writes, so one run has one
writer. `workbench.lab.frames` loads run directories into pandas. The two evaluation tables are described in
`workbench.core.evalcsv`.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from workbench.config.loading import config_hash, read_run_config
from workbench.core import io as wio
from workbench.core.evalcsv import EVAL_COLUMNS, ITEM_COLUMNS, append_rows, eval_row, item_row, truncate
from workbench.core.io import to_float, to_jsonable, to_plain
from workbench.train.environment import collect_environment

__all__ = [
    "RunWriter",
    "create_run_dir",
    "find_run",
    "run_code_version",
]

logger = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_MAX_TRIES = 100


def _check_name(kind: str, value: str) -> None:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ValueError(
            f"{kind}={value!r} is not a valid directory name: use letters, digits and _ . + - "
            "(not starting with . or -)"
        )


def _utc_stamp() -> str:
    """The timestamp part of a default run id (a function so tests can force collisions)."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def create_run_dir(root: Path | str, experiment: str, *, run_id: str | None = None) -> Path:
    """Create ``root/<experiment>/<run-id>/`` exclusively.

    Args:
        root: The results root (``results/``); created if missing.
        experiment: Experiment name (a directory name).
        run_id: Explicit run id; default ``<UTC timestamp>-<4 random hex>``, retried with a fresh suffix if
            another process took the same name first.

    Returns:
        The new, empty run directory.

    Raises:
        FileExistsError: An explicit ``run_id`` already exists (resume it instead).
        ValueError: ``experiment`` or ``run_id`` is not a safe directory name.
    """
    _check_name("experiment", experiment)
    exp_dir = Path(root) / experiment
    exp_dir.mkdir(parents=True, exist_ok=True)
    if run_id is not None:
        _check_name("run_id", run_id)
        path = exp_dir / run_id
        try:
            path.mkdir()  # no exist_ok: the directory is ours only if we created it
        except FileExistsError:
            raise FileExistsError(
                f"run directory {path} already exists: resume it (load its latest checkpoint) "
                "or pass another run_id"
            ) from None
        return path
    for _ in range(_MAX_TRIES):
        path = exp_dir / f"{_utc_stamp()}-{secrets.token_hex(2)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a unique run directory under {exp_dir} in {_MAX_TRIES} tries")


def run_code_version(run_dir: Path | str) -> str | None:
    """The `code_version` that started a run (``environment.json``), or None when it is not recorded."""
    try:
        value = _read_json(Path(run_dir) / "environment.json").get("code_version")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) else None


def find_run(
    root: Path | str, experiment: str, cfg_hash: str, *, code_version: str | None = None
) -> Path | None:
    """The newest run of ``experiment`` whose ``config.yaml`` hashes to ``cfg_hash`` (for resume/skip).

    With ``code_version``, only runs started by that code version count (`run_code_version`): a run made by
    other code is never resumed or reused silently. "Newest" is by ``config.yaml`` modification time, then by
    name. Unreadable configs are skipped with a warning.
    """
    exp_dir = Path(root) / experiment
    if not exp_dir.is_dir():
        return None
    matches: list[tuple[int, str, Path]] = []
    for cfg_path in exp_dir.glob("*/config.yaml"):
        try:
            cfg = read_run_config(cfg_path.parent)
        except (OSError, ValueError, yaml.YAMLError) as err:
            logger.warning("find_run: skipping %s: %s", cfg_path, err)
            continue
        if config_hash(cfg) == cfg_hash and (
            code_version is None or run_code_version(cfg_path.parent) == code_version
        ):
            matches.append((cfg_path.stat().st_mtime_ns, cfg_path.parent.name, cfg_path.parent))
    return max(matches)[2] if matches else None


def _step_of(value: Any, lowest: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise ValueError(f"step must be an int >= {lowest}, got {value!r}")
    return value


class RunWriter:
    """Writes one run directory. ``write_config`` must come first; every other write checks it.

    Args:
        run_dir: An existing run directory (from `create_run_dir`, or an old one being resumed).
    """

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise FileNotFoundError(f"run directory {self.run_dir} does not exist (use create_run_dir)")
        self.config_path = self.run_dir / "config.yaml"
        self.environment_path = self.run_dir / "environment.json"
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.evals_path = self.run_dir / "evals.csv"
        self.items_path = self.run_dir / "eval_items.csv"
        self.samples_dir = self.run_dir / "samples"
        self.done_path = self.run_dir / "DONE"
        self._last_seen: tuple[int, int] | None = None  # (last step logged, metrics.jsonl size then)

    def _require_config(self, what: str) -> None:
        if not self.config_path.exists():
            raise RuntimeError(f"{what}: write_config() must be called first in {self.run_dir}")

    def write_config(self, cfg: dict[str, Any]) -> None:
        """Write ``config.yaml`` (the first file of a run). Again with the same config: a no-op (resume).

        Raises:
            ValueError: A different config is already there (names the differing top-level keys).
            TypeError: The config holds a value YAML cannot represent (names its key path).
        """
        plain = to_plain(cfg)
        if not isinstance(plain, dict):
            raise TypeError(f"write_config: cfg must be a dict, got {type(cfg).__name__}")
        if self.config_path.exists():
            old = read_run_config(self.run_dir)
            if config_hash(old) != config_hash(plain):
                keys = sorted(k for k in set(old) | set(plain) if old.get(k) != plain.get(k))
                raise ValueError(
                    f"{self.config_path} already holds a different config (keys differ: {keys}); "
                    "a run directory belongs to one config: create a new run"
                )
            return
        wio.atomic_write_yaml(self.config_path, plain)

    def write_environment(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write ``environment.json``; on resume keep the original and append this start under ``resumes``.

        Args:
            extra: Additional top-level entries (they override the collected ones of the same name).

        Returns:
            The entry recorded for this start.
        """
        self._require_config("write_environment")
        env = collect_environment()
        env.update(to_jsonable(extra or {}))
        if self.environment_path.exists():
            doc = _read_json(self.environment_path)
            doc.setdefault("resumes", []).append(env)
        else:
            doc = env
        wio.atomic_write_json(self.environment_path, doc)
        return env

    def record_start(self, entries: dict[str, Any]) -> None:
        """Add ``entries`` to this start's record in ``environment.json`` (the last `write_environment`: the
        top level on a first start, the last ``resumes`` entry on a resume), e.g. the starting-weights
        digests, known only once the agents are loaded.

        Raises:
            RuntimeError: `write_environment` was not called first.
        """
        if not self.environment_path.exists():
            raise RuntimeError(f"record_start: write_environment() must be called first in {self.run_dir}")
        doc = _read_json(self.environment_path)
        resumes = doc.get("resumes")
        target = resumes[-1] if isinstance(resumes, list) and resumes else doc
        target.update(to_jsonable(entries))
        wio.atomic_write_json(self.environment_path, doc)

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one line ``{"step": step, **metrics}`` to ``metrics.jsonl``.

        Several calls for the same step are allowed (`load_runs` merges them); a step below the last one
        logged is refused (call `rollback_to` when resuming).

        Raises:
            TypeError: A key is not a string, or a value is not a scalar number (names the key).
            ValueError: A bad or decreasing step, or the reserved key ``"step"``.
        """
        self._require_config("log_metrics")
        _step_of(step)
        last = self.last_logged_step()
        if step < last:
            raise ValueError(
                f"log_metrics: step {step} < last logged step {last} in {self.metrics_path}; "
                "call rollback_to(step) when resuming from a checkpoint"
            )
        row: dict[str, Any] = {"step": step}
        for key, value in metrics.items():
            if not isinstance(key, str):
                raise TypeError(f"log_metrics: metric keys must be str, got {key!r} ({type(key).__name__})")
            if key == "step":
                raise ValueError("log_metrics: 'step' is reserved; pass it as the step argument")
            row[key] = to_float(value, key)
        wio.append_jsonl(self.metrics_path, row)
        self._last_seen = (step, self.metrics_path.stat().st_size)

    def last_logged_step(self) -> int:
        """Last step in ``metrics.jsonl`` (-1 if none); re-read only when the file changed under us
        (another writer object, a rollback), so logging stays O(1) per step."""
        size = self.metrics_path.stat().st_size if self.metrics_path.exists() else -1
        if self._last_seen is None or self._last_seen[1] != size:
            rows = wio.read_jsonl(self.metrics_path) if size >= 0 else []
            self._last_seen = (max((int(r["step"]) for r in rows if "step" in r), default=-1), size)
        return self._last_seen[0]

    def write_samples(self, step: int, rows: list[dict[str, Any]]) -> Path:
        """Write ``samples/step_{step:06d}.jsonl`` atomically (tensors/arrays become lists)."""
        self._require_config("write_samples")
        _step_of(step)
        self.samples_dir.mkdir(exist_ok=True)
        path = self.samples_dir / f"step_{step:06d}.jsonl"
        text = "".join(_dumps_line(to_jsonable(row)) for row in rows)
        wio.atomic_write_text(path, text)
        return path

    def append_evals(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Append rows ``{agent, benchmark, metric, value}`` at ``step`` to ``evals.csv`` (atomic rewrite).

        Raises:
            ValueError: A row lacks a field, has a conflicting ``step``, or an unknown metric name
                (allowed: ``greedy_acc``, ``avg@k``, ``pass@k``, ``best@k`` with an integer k >= 1).
        """
        self._require_config("append_evals")
        _step_of(step)
        append_rows(self.evals_path, EVAL_COLUMNS, step, rows, eval_row)

    def append_eval_items(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Append per-item rows ``{agent, benchmark, item, greedy, sampled, k}`` at ``step`` to
        ``eval_items.csv`` (atomic rewrite; `workbench.core.evalcsv` describes the columns).

        Raises:
            ValueError: A row lacks a field, has a conflicting ``step`` or an out-of-range count.
        """
        self._require_config("append_eval_items")
        _step_of(step)
        append_rows(self.items_path, ITEM_COLUMNS, step, rows, item_row)

    def mark_done(self, summary: dict[str, Any]) -> None:
        """Write the ``DONE`` marker: the summary as JSON plus the finish time."""
        self._require_config("mark_done")
        doc = {**to_jsonable(summary), "finished_at": datetime.now(UTC).isoformat(timespec="seconds")}
        wio.atomic_write_json(self.done_path, doc)

    def is_done(self) -> bool:
        """True when the run finished (``DONE`` exists)."""
        return self.done_path.exists()

    def rollback_to(self, step: int) -> dict[str, int]:
        """Drop everything logged after ``step`` (metrics, evals, eval items, samples) and ``DONE``.

        Called on resume from the checkpoint of ``step``, so the resumed run re-logs those steps exactly
        once; ``step=-1`` drops every logged step (a run killed before its first checkpoint). Temporary files
        of interrupted writes are removed too. Checkpoints are not touched (`workbench.train.checkpoint`
        owns them). Call it only while holding the run's lock: another writer's temporary files would go.

        Returns:
            Counts of what was dropped: ``metrics``, ``evals``, ``eval_items`` (rows), ``samples`` (files).
        """
        _step_of(step, lowest=-1)
        dropped = {
            "metrics": wio.truncate_jsonl(self.metrics_path, lambda r: int(r.get("step", 0)) <= step),
            "evals": truncate(self.evals_path, step),
            "eval_items": truncate(self.items_path, step),
            "samples": 0,
        }
        if self.samples_dir.is_dir():
            for path in self.samples_dir.glob("step_*.jsonl"):
                m = re.fullmatch(r"step_(\d+)\.jsonl", path.name)
                if m and int(m.group(1)) > step:
                    path.unlink()
                    dropped["samples"] += 1
        if self.done_path.exists():
            self.done_path.unlink()
        self._remove_temp_files()
        if any(dropped.values()):
            logger.info("rolled %s back to step %d, dropped %s", self.run_dir, step, dropped)
        return dropped

    def _remove_temp_files(self) -> None:
        """Remove ``.<name>.*.tmp`` files: atomic writes a kill interrupted (never renamed into place)."""
        for folder in (self.run_dir, self.samples_dir):
            for path in folder.glob(".*.tmp") if folder.is_dir() else ():
                logger.info("removing %s, left by an interrupted write", path)
                path.unlink(missing_ok=True)


def _dumps_line(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------- loading


def _read_json(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return doc
