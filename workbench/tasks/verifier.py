"""math-verify, and your own reward functions, in bounded worker processes, usable from any thread.

math-verify bounds its own parsing and comparison with ``signal.alarm``, which works only in a main thread and
cannot interrupt long C-level work (a big-integer power, say). So each comparison runs in a small pool of
worker processes (plain ``python -c`` subprocesses: no fork of a process that holds torch threads, no
re-import of the caller's ``__main__``). Inside a worker math-verify keeps short alarms of its own
(`SOFT_TIMEOUT_S`); the parent kills and replaces any worker that has not answered within `HARD_TIMEOUT_S`.

The functions of ``task.rewards`` named ``package.module:function`` run in the same workers under the same
deadline (`call_function`), so a function that hangs or crashes cannot stop a run.

Protocol: the worker prints ``ready`` once imported, then answers each JSON line ``{"p": answer, "g": gold}``
with ``{"r": reason}`` and each ``{"f": function, "c": completion, "k": columns}`` with ``{"v": value}`` or
``{"e": error}``, one line each.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

SOFT_TIMEOUT_S = 1
"""math-verify's own alarm, per parse and per comparison, inside a worker (whole seconds: signal.alarm)."""

HARD_TIMEOUT_S = 1.5
"""Wall-clock limit per comparison, enforced by killing the worker; its verdict is then "timeout"."""

START_TIMEOUT_S = 60.0
"""How long a new worker may take to import math-verify before it is given up on."""

N_WORKERS = max(1, min(2, os.cpu_count() or 1))
"""Worker processes (each ≈ 80 MB; the machines this runs on have 2 cores)."""

_CACHE_SIZE = 100_000
_WORKER_CODE = "from workbench.tasks.verifier import serve; serve()"


# ----------------------------------------------------------------------------------------------------------
# Worker side


def _verdict(answer: str, gold: str, parse, verify) -> str:
    from math_verify.errors import TimeoutException

    try:
        gold_parsed = _parse_gold(gold)
        pred = parse(f"\\boxed{{{answer}}}", parsing_timeout=SOFT_TIMEOUT_S, raise_on_error=True)
        if not pred:
            return "malformed"
        if not gold_parsed:
            return "wrong"
        ok = verify(gold_parsed, pred, timeout_seconds=SOFT_TIMEOUT_S, raise_on_error=True)
        return "correct" if ok else "wrong"
    except TimeoutException:
        return "timeout"
    except (Exception, RecursionError):
        return "malformed"


def _parse_gold(gold: str):
    from math_verify import parse

    wrapped = gold if ("$" in gold or "\\boxed" in gold) else f"${gold}$"
    return parse(wrapped, parsing_timeout=SOFT_TIMEOUT_S)


def _call(request: dict) -> dict:
    """A ``task.rewards`` function called on one completion: ``{"v": value}`` or ``{"e": "Type: text"}``."""
    from workbench.tasks.term_call import TermValueError, call_term, import_function

    try:
        fn = import_function(str(request["f"]))
        return {"v": call_term(fn, str(request["c"]), dict(request.get("k") or {}))}
    except TermValueError as exc:  # what it returned, said as is
        return {"e": str(exc)}
    except Exception as exc:  # the parent names the function and the item
        return {"e": f"{type(exc).__name__}: {exc}"}


def serve() -> None:
    """Worker main loop: reads JSON requests on stdin, writes one answer line each on stdout.

    A request ``{"p": answer, "g": gold}`` is a math-verify comparison (answer ``{"r": reason}``); ``{"f":
    "package.module:function", "c": completion, "k": columns}`` calls a reward function (``{"v": value}`` or
    ``{"e": error}``). The answers go to a copy of the original stdout, and stdout itself is pointed at
    stderr, so a function that prints cannot break the protocol.
    """
    import functools

    logging.disable(logging.WARNING)  # math-verify logs every unparsable answer
    from math_verify import parse, verify

    global _parse_gold
    _parse_gold = functools.lru_cache(maxsize=4096)(_parse_gold)  # gold answers repeat across samples
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if "f" in request:
                answer = _call(request)
            else:
                answer = {"r": _verdict(str(request["p"]), str(request["g"]), parse, verify)}
        except Exception:
            answer = {"r": "malformed"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


# ----------------------------------------------------------------------------------------------------------
# Parent side


@dataclass
class _Worker:
    proc: subprocess.Popen
    started: float
    ready: bool = False
    job: int | None = None
    deadline: float = 0.0
    buffer: bytes = field(default=b"")

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:
            logger.debug("could not reap verifier worker %s", self.proc.pid, exc_info=True)


def _spawn() -> _Worker:
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding `workbench/`
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER_CODE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        close_fds=True,
    )
    return _Worker(proc=proc, started=time.monotonic())


class VerifierPool:
    """A few math-verify worker processes; `run` is thread-safe and bounded per comparison."""

    def __init__(self, n_workers: int = N_WORKERS) -> None:
        self.n_workers = n_workers
        self.workers: list[_Worker] = []
        self.lock = threading.Lock()
        self.cache: dict[tuple[str, str], str] = {}

    def close(self) -> None:
        """Stops every worker."""
        with self.lock:
            for w in self.workers:
                w.kill()
            self.workers = []

    def run(self, pairs: list[tuple[str, str]]) -> list[str]:
        """Verifies ``(answer, gold)`` pairs; returns one reason per pair."""
        with self.lock:
            results: list[str | None] = [self.cache.get(p) for p in pairs]
            todo = deque(i for i, r in enumerate(results) if r is None)
            if todo:
                payloads = [{"p": answer, "g": gold} for answer, gold in pairs]
                answers = self._guarded(payloads, todo, timeout={"r": "timeout"}, died={"r": "malformed"})
                for i, answer in answers.items():
                    results[i] = str(answer.get("r", "malformed"))
            if len(self.cache) > _CACHE_SIZE:
                self.cache.clear()
            for p, r in zip(pairs, results):
                if r in ("correct", "wrong", "malformed"):
                    self.cache[p] = r
            return [r or "timeout" for r in results]

    def call(self, spec: str, calls: list[tuple[str, dict]]) -> list[dict]:
        """Calls the reward function ``spec`` on each ``(completion, columns)``, each bounded by
        `HARD_TIMEOUT_S`; returns per call ``{"v": value}``, ``{"e": error}`` or ``{"t": True}`` (timeout)."""
        with self.lock:
            payloads = [{"f": spec, "c": completion, "k": columns} for completion, columns in calls]
            answers = self._guarded(
                payloads,
                deque(range(len(payloads))),
                timeout={"t": True},
                died={"e": "its worker process died"},
            )
            return [answers.get(i, {"t": True}) for i in range(len(payloads))]

    def _guarded(self, payloads: list[dict], todo: deque, *, timeout: dict, died: dict) -> dict[int, dict]:
        """`_run`, every worker killed when it raises (a worker may still owe an answer: never let it reach a
        later call)."""
        answers: dict[int, dict] = {}
        try:
            self._run(payloads, answers, todo, timeout, died)
        except BaseException:
            for w in self.workers:
                w.kill()
            self.workers = []
            raise
        return answers

    def spawn_missing(self) -> None:
        """Starts workers up to `n_workers` (call with the lock held)."""
        while len(self.workers) < self.n_workers:
            self.workers.append(_spawn())

    def _run(
        self, payloads: list[dict], answers: dict[int, dict], todo: deque, timeout: dict, died: dict
    ) -> None:
        self.spawn_missing()
        failed_starts = 0
        while todo or any(w.job is not None for w in self.workers):
            now = time.monotonic()
            for i, w in enumerate(list(self.workers)):  # hand out work
                if w.ready and w.job is None and todo:
                    job = todo.popleft()
                    try:
                        w.proc.stdin.write((json.dumps(payloads[job]) + "\n").encode())
                        w.proc.stdin.flush()
                    except OSError:  # the worker died while idle: requeue, replace it
                        todo.appendleft(job)
                        self._replace(i, answers, died)
                        continue
                    w.job, w.deadline = job, now + HARD_TIMEOUT_S
            waits = [w.deadline if w.ready else w.started + START_TIMEOUT_S for w in self.workers]
            wait_s = max(0.0, min(waits) - time.monotonic())
            readable, _, _ = select.select([w.proc.stdout for w in self.workers], [], [], wait_s)
            for i, w in enumerate(list(self.workers)):
                if w.proc.stdout in readable:
                    chunk = os.read(w.proc.stdout.fileno(), 65536)
                    if not chunk:  # the worker died (a crash inside sympy, say)
                        failed_starts += not w.ready
                        self._replace(i, answers, died)
                        continue
                    w.buffer += chunk
                    self._consume(w, answers)
            now = time.monotonic()
            for i, w in enumerate(list(self.workers)):
                if w.ready and w.job is not None and now > w.deadline:
                    self._replace(i, answers, timeout)
                elif not w.ready and now > w.started + START_TIMEOUT_S:
                    failed_starts += 1
                    self._replace(i, answers, timeout)
            if failed_starts >= 2 * self.n_workers:
                logger.error(
                    "math-verify workers fail to start; %d comparisons counted as timeout", len(todo)
                )
                todo.clear()

    def _consume(self, w: _Worker, answers: dict[int, dict]) -> None:
        while b"\n" in w.buffer:
            line, w.buffer = w.buffer.split(b"\n", 1)
            if not w.ready:
                w.ready = line.strip() == b"ready"
                continue
            if w.job is not None:
                try:
                    answer = json.loads(line)
                except ValueError:
                    answer = None
                answers[w.job] = answer if isinstance(answer, dict) else {"r": "malformed", "e": "no answer"}
                w.job = None

    def _replace(self, i: int, answers: dict[int, dict], answer: dict) -> None:
        w = self.workers[i]
        if w.job is not None:
            answers[w.job] = answer
        w.kill()
        self.workers[i] = _spawn()


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()


def _shared_pool() -> VerifierPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifierPool()
            atexit.register(_POOL.close)
        return _POOL


def start() -> None:
    """Starts the shared workers now, without waiting for them (their import takes ≈1 s), so that the first
    `verify_pairs` does not pay for it. Optional."""
    pool = _shared_pool()
    with pool.lock:
        pool.spawn_missing()


def verify_pairs(pairs: list[tuple[str, str]]) -> list[str]:
    """Verifies ``(extracted answer, gold)`` pairs with math-verify in the shared worker pool.

    Returns:
        One reason per pair: ``"correct"``, ``"wrong"``, ``"timeout"`` or ``"malformed"``.
    """
    try:
        return _shared_pool().run(pairs)
    except Exception:  # e.g. processes cannot be started here: count as timeouts, never crash a run
        logger.exception("math-verify pool failed; %d comparisons counted as timeout", len(pairs))
        return ["timeout"] * len(pairs)


def call_function(spec: str, calls: list[tuple[str, dict]]) -> list[dict]:
    """Calls the reward function ``spec`` on each ``(completion, columns)`` in the shared worker pool, each
    call bounded by `HARD_TIMEOUT_S` (`VerifierPool.call`).

    Raises:
        OSError: The worker processes cannot be started here.
    """
    return _shared_pool().call(spec, calls)


def close() -> None:
    """Stops the shared worker pool (it restarts on the next use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()
            _POOL = None
