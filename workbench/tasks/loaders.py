"""Reading the paper's data sets from local files (or the hub), in the layouts they are commonly published in.

Accepted files: ``.jsonl`` (one JSON object per line), ``.json`` (a list of objects, or an object holding one
such list under a key such as ``"data"``), ``.parquet`` (one row per item). Each record's layout is detected
from its fields, first match wins:

| field | looked up in (first match wins) |
|---|---|
| question | ``problem``, ``question``, ``Problem``, ``Question``, ``input``, ``prompt`` (text, or a chat |
| | list: the last user message, the paper's instruction stripped, as in verl's parquet files) |
| answer | ``answer`` (GSM8K's ``"... #### 72"`` gives ``72``), ``final_answer`` (OlympiadBench: a list |
| | is joined with ``", "``), ``reward_model.ground_truth`` (verl), ``ground_truth``, |
| | ``expected_answer``, ``target``, ``Answer``; else the last ``\\boxed{...}`` in ``solution`` (MATH) |
| solution | ``solution`` (a list is joined), else GSM8K's worked answer (``#### x`` -> ``\\boxed{x}``) |
| id | ``id``, ``unique_id``, ``idx``, ``problem_id``, ``ID``; else ``<source>-<row>`` |

Answers lose surrounding ``$``; integer-valued numbers are written without ``.0``; GSM8K answers lose
thousands separators. Benchmarks are looked up in ``path=``, else in ``$HACPO_DATA_DIR`` as
``<name>_<split>.<ext>``, ``<name>-<split>.<ext>``, ``<name>/<split>.<ext>`` or ``<name>.<ext>``, else through
``datasets`` (when it is installed and the hub answers within a few seconds).
"""

from __future__ import annotations

import json
import logging
import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.core import env
from workbench.core.types import TaskItem
from workbench.tasks.prompts import PAPER_INSTRUCTION
from workbench.tasks.rewards import last_boxed

logger = logging.getLogger(__name__)

DATA_DIR_ENV = env.DATA_DIR_ENV
"""Environment variable naming the folder that holds the benchmark files."""

EXTENSIONS = (".jsonl", ".json", ".parquet")
QUESTION_FIELDS = ("problem", "question", "Problem", "Question", "input", "prompt")
ANSWER_FIELDS = (
    "answer",
    "final_answer",
    "reward_model",
    "ground_truth",
    "expected_answer",
    "target",
    "Answer",
)
ID_FIELDS = ("id", "unique_id", "idx", "problem_id", "ID")
_JSON_LIST_KEYS = ("data", "test", "train", "examples", "rows", "instances", "problems")
_HUB_TIMEOUT_S = 3.0
DATASETS_REQUIREMENT = "datasets==5.2.0"
"""The pinned ``datasets`` of the ``data`` extra (pyproject.toml), named when it is missing."""


@dataclass(frozen=True)
class Benchmark:
    """Where a benchmark lives on the hub, and which splits it has.

    Attributes:
        hub_id: Hugging Face dataset id used by the ``datasets`` fallback.
        config: Dataset configuration name, if any.
        splits: Splits it has; evaluation-only benchmarks have just ``("test",)``.
    """

    hub_id: str
    config: str | None = None
    splits: tuple[str, ...] = ("test",)


BENCHMARKS: dict[str, Benchmark] = {
    # The MATH training set the paper trains on (verl's preprocessing of it) and the MATH test split.
    "math": Benchmark("DigitalLearningGmbH/MATH-lighteval", "default", ("train", "test")),
    "math500": Benchmark("HuggingFaceH4/MATH-500"),
    "gsm8k": Benchmark("openai/gsm8k", "main", ("train", "test")),
    "aime2025": Benchmark("math-ai/aime25"),
    "amc23": Benchmark("math-ai/amc23"),
    "minerva": Benchmark("math-ai/minervamath"),
    "olympiadbench": Benchmark("math-ai/olympiadbench"),
}
"""The paper's training set and seven benchmarks (Sec. 5, App. A). Hub ids are the commonly used copies."""


def _plain(value: Any) -> Any:
    """Turns parquet's numpy arrays (nested) into lists."""
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def read_records(path: str | Path) -> list[tuple[str, dict]]:
    """Reads the records of a JSONL, JSON or parquet file.

    Args:
        path: The file.

    Returns:
        ``(where, record)`` pairs, ``where`` naming the file and line or row for error messages.

    Raises:
        FileNotFoundError: No such file.
        ValueError: Unknown extension, invalid JSON (naming the line), a record that is not an object.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no task file at {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        records = []
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    records.append((f"{path}:{lineno}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
        if isinstance(data, dict):
            keys = [k for k in _JSON_LIST_KEYS if isinstance(data.get(k), list)]
            if not keys:
                raise ValueError(
                    f"{path}: a JSON file must hold a list of objects, or an object with the list under one "
                    f"of {list(_JSON_LIST_KEYS)}; found an object with keys {sorted(data)[:10]}"
                )
            data = data[keys[0]]
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a list of objects, found {type(data).__name__}")
        records = [(f"{path}[{i}]", record) for i, record in enumerate(data)]
    elif suffix == ".parquet":
        import pandas as pd  # lazy: only parquet needs it

        frame = pd.read_parquet(path)
        records = [(f"{path} row {i}", _plain(r)) for i, r in enumerate(frame.to_dict("records"))]
    else:
        raise ValueError(f"{path}: unknown file type {suffix!r}; accepted: {list(EXTENSIONS)}")
    for where, record in records:
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object per item, found {type(record).__name__}")
    if not records:
        raise ValueError(f"{path}: the file holds no items")
    return records


def _question(record: dict, where: str) -> str:
    for field in QUESTION_FIELDS:
        value = record.get(field)
        if isinstance(value, list):  # a chat: take the last user message
            users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
            value = users[-1] if users else None
        if isinstance(value, str) and value.strip():
            text = value.strip()
            if text.endswith(PAPER_INSTRUCTION):
                text = text[: -len(PAPER_INSTRUCTION)].rstrip()
            return text
    raise ValueError(
        f"{where}: no question; looked for a non-empty text field among {list(QUESTION_FIELDS)}, "
        f"the record has fields {sorted(record)}"
    )


def _clean_answer(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    while len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    return text


def _answer_and_solution(record: dict, where: str) -> tuple[str, str | None]:
    solution = record.get("solution")
    if isinstance(solution, list):
        solution = "\n".join(str(s) for s in solution)
    solution = solution if isinstance(solution, str) and solution.strip() else None
    for field in ANSWER_FIELDS:
        value = record.get(field)
        if field == "reward_model":
            value = value.get("ground_truth") if isinstance(value, dict) else None
        if value is None or value == "" or value == []:
            continue
        if isinstance(value, list):
            return ", ".join(_clean_answer(v) for v in value), solution
        if isinstance(value, str) and "####" in value:  # GSM8K: worked text, then "#### 72"
            head, _, tail = value.rpartition("####")
            answer = _clean_answer(tail).replace(",", "")
            return answer, solution or f"{head.rstrip()}\n\\boxed{{{answer}}}"
        return _clean_answer(value), solution
    boxed = last_boxed(solution) if solution else None
    if boxed:
        return _clean_answer(boxed), solution
    raise ValueError(
        f"{where}: no answer; looked for {list(ANSWER_FIELDS)} or a \\boxed{{}} in 'solution', "
        f"the record has fields {sorted(record)}"
    )


def record_to_item(record: dict, where: str, source: str, index: int) -> TaskItem:
    """Converts one record of any accepted layout into a `TaskItem` (see the module docstring)."""
    question = _question(record, where)
    answer, solution = _answer_and_solution(record, where)
    if solution is not None and "\\boxed" not in solution:
        solution = f"{solution.rstrip()}\n\\boxed{{{answer}}}"
    ids = [record[f] for f in ID_FIELDS if record.get(f) not in (None, "")]
    item_id = f"{source}-{ids[0]}" if ids else f"{source}-{index}"
    return TaskItem(id=item_id, question=question, answer=answer, solution=solution, source=source)


def read_items(path: str | Path, source: str | None = None) -> list[TaskItem]:
    """Reads a local data file into task items, detecting its layout per record.

    Args:
        path: A ``.jsonl``, ``.json`` or ``.parquet`` file.
        source: Name recorded in each item's ``source`` (default: the file's stem).

    Returns:
        The items, in file order.

    Raises:
        FileNotFoundError, ValueError: As `read_records`, or a record with no question or answer (naming it).
    """
    source = source or Path(path).stem
    return [record_to_item(r, where, source, i) for i, (where, r) in enumerate(read_records(path))]


def _local_candidates(name: str, split: str, directory: Path) -> list[Path]:
    stems = [f"{name}_{split}", f"{name}-{split}", f"{name}/{split}", name]
    return [directory / f"{stem}{ext}" for stem in stems for ext in EXTENSIONS]


def _hub_reachable() -> str | None:
    """Returns why the hub cannot be used, or None when it can."""
    if env.hub_offline(datasets=True):
        return "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set"
    try:
        import datasets  # noqa: F401
    except ImportError:
        return (
            f"the `datasets` package is not installed (the `data` extra: pip install -e '.[data]', or pip "
            f"install {DATASETS_REQUIREMENT})"
        )
    try:
        socket.create_connection(("huggingface.co", 443), timeout=_HUB_TIMEOUT_S).close()
    except OSError as e:
        return f"huggingface.co is unreachable ({e})"
    return None


def load_benchmark(name: str, split: str = "train", path: str | Path | None = None) -> list[TaskItem]:
    """Loads one of `BENCHMARKS` from a local file, else from the hub.

    Args:
        name: A key of `BENCHMARKS`.
        split: ``"train"`` or ``"test"`` for benchmarks with both; ignored by evaluation-only ones.
        path: A local file to read instead of searching ``$HACPO_DATA_DIR``.

    Returns:
        The items, ``source=name``.

    Raises:
        ValueError: Unknown name (listing the valid ones), or a malformed file.
        FileNotFoundError: No local file and no usable hub; the message lists where files were looked for.
    """
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; valid names: {list(BENCHMARKS)}")
    bench = BENCHMARKS[name]
    if split not in bench.splits:
        split = bench.splits[0]
    if path is not None:
        return read_items(path, source=name)
    searched: list[Path] = []
    if env.data_dir() is not None:
        searched = _local_candidates(name, split, env.data_dir())
        for candidate in searched:
            if candidate.is_file():
                return read_items(candidate, source=name)
    why = _hub_reachable()
    if why is not None:
        where = f"looked for {[str(p) for p in searched[:4]]} ... ({len(searched)} names)" if searched else ""
        raise FileNotFoundError(
            f"benchmark {name!r} ({split}): no local file and the hub fallback is unavailable: {why}. Pass "
            f"path='<file>.jsonl|.json|.parquet', or put {name}_{split}.jsonl (or {name}.jsonl, .json, "
            f".parquet) in ${DATA_DIR_ENV}. {where}".rstrip()
        )
    import datasets

    logger.info("loading %s (%s) from the hub: %s", name, split, bench.hub_id)
    rows = datasets.load_dataset(bench.hub_id, bench.config, split=split)
    where = f"hub:{bench.hub_id}"
    return [record_to_item(_plain(dict(r)), f"{where} row {i}", name, i) for i, r in enumerate(rows)]


def subset(items: list[TaskItem], n: int | None, seed: int) -> list[TaskItem]:
    """Takes a seeded random subset of ``n`` items, kept in their original order (all when ``n`` is None)."""
    if n is None or n >= len(items):
        return items
    if n < 0:
        raise ValueError(f"n={n!r} must be >= 0")
    keep = sorted(random.Random(seed).sample(range(len(items)), n))
    return [items[i] for i in keep]
