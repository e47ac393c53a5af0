"""math-verify in bounded worker processes, usable from any thread.

math-verify bounds its own parsing and comparison with ``signal.alarm``, which works only in a main thread and
cannot interrupt long C-level work (a big-integer power, say). So each comparison runs in a small pool of
worker processes (plain ``python -c`` subprocesses: no fork of a process that holds torch threads, no
re-import of the caller's ``__main__``). Inside a worker math-verify keeps short alarms of its own
(`SOFT_TIMEOUT_S`); the parent kills and replaces any worker that has not answered within `HARD_TIMEOUT_S`.

Protocol: the worker prints ``ready`` once imported, then answers each JSON line ``{"p": answer, "g": gold}``
with ``{"r": reason}``, one line each.
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


def serve() -> None:
    """Worker main loop: reads JSON requests on stdin, writes one verdict line each on stdout."""
    import functools

    logging.disable(logging.WARNING)  # math-verify logs every unparsable answer
    from math_verify import parse, verify

    global _parse_gold
    _parse_gold = functools.lru_cache(maxsize=4096)(_parse_gold)  # gold answers repeat across samples
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reason = _verdict(str(request["p"]), str(request["g"]), parse, verify)
        except Exception:
            reason = "malformed"
        out.write(json.dumps({"r": reason}) + "\n")
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
                try:
                    self._run(pairs, results, todo)
                except BaseException:  # a worker may still owe an answer: never let it reach a later call
                    for w in self.workers:
                        w.kill()
                    self.workers = []
                    raise
            if len(self.cache) > _CACHE_SIZE:
                self.cache.clear()
            for p, r in zip(pairs, results):
                if r in ("correct", "wrong", "malformed"):
                    self.cache[p] = r
            return [r or "timeout" for r in results]

    def spawn_missing(self) -> None:
        """Starts workers up to `n_workers` (call with the lock held)."""
        while len(self.workers) < self.n_workers:
            self.workers.append(_spawn())

    def _run(self, pairs: list[tuple[str, str]], results: list[str | None], todo: deque) -> None:
        self.spawn_missing()
        failed_starts = 0
        while todo or any(w.job is not None for w in self.workers):
            now = time.monotonic()
            for i, w in enumerate(list(self.workers)):  # hand out work
                if w.ready and w.job is None and todo:
                    job = todo.popleft()
                    answer, gold = pairs[job]
                    try:
                        w.proc.stdin.write((json.dumps({"p": answer, "g": gold}) + "\n").encode())
                        w.proc.stdin.flush()
                    except OSError:  # the worker died while idle: requeue, replace it
                        todo.appendleft(job)
                        self._replace(i, results, "malformed")
                        continue
                    w.job, w.deadline = job, now + HARD_TIMEOUT_S
            waits = [w.deadline if w.ready else w.started + START_TIMEOUT_S for w in self.workers]
            timeout = max(0.0, min(waits) - time.monotonic())
            readable, _, _ = select.select([w.proc.stdout for w in self.workers], [], [], timeout)
            for i, w in enumerate(list(self.workers)):
                if w.proc.stdout in readable:
                    chunk = os.read(w.proc.stdout.fileno(), 65536)
                    if not chunk:  # the worker died (a crash inside sympy, say)
                        failed_starts += not w.ready
                        self._replace(i, results, "malformed")
                        continue
                    w.buffer += chunk
                    self._consume(w, results)
            now = time.monotonic()
            for i, w in enumerate(list(self.workers)):
                if w.ready and w.job is not None and now > w.deadline:
                    self._replace(i, results, "timeout")
                elif not w.ready and now > w.started + START_TIMEOUT_S:
                    failed_starts += 1
                    self._replace(i, results, "timeout")
            if failed_starts >= 2 * self.n_workers:
                logger.error(
                    "math-verify workers fail to start; %d comparisons counted as timeout", len(todo)
                )
                todo.clear()

    def _consume(self, w: _Worker, results: list[str | None]) -> None:
        while b"\n" in w.buffer:
            line, w.buffer = w.buffer.split(b"\n", 1)
            if not w.ready:
                w.ready = line.strip() == b"ready"
                continue
            if w.job is not None:
                try:
                    results[w.job] = json.loads(line)["r"]
                except (ValueError, KeyError):
                    results[w.job] = "malformed"
                w.job = None

    def _replace(self, i: int, results: list[str | None], reason: str) -> None:
        w = self.workers[i]
        if w.job is not None:
            results[w.job] = reason
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


def close() -> None:
    """Stops the shared worker pool (it restarts on the next use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()
            _POOL = None
