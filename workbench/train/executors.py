"""Where the agents' workers run: in the trainer's process, one after another or all at once on a thread each,
or in Ray actors, in parallel.

Every executor holds one `AgentWorker` per agent and implements the `Executor` protocol: one method per worker
call (``rollout``, ``update``, ``evaluate``, ``state_dicts``...), each taking and returning the records of
`workbench.train.exchange`, one per agent, in agent order. The trainer never knows which executor it has.

| executor | workers | agents run | resources per agent |
|---|---|---|---|
| `InProcessExecutor` (``local``, default) | in the trainer's process | one after another | the process's |
| `InProcessExecutor` (``threads``) | in the trainer's process | at once, a thread each | threads ÷ agents |
| `RayExecutor` (``ray``) | one Ray actor each | in parallel | ``ray.cpus_per_agent`` CPUs (= torch |
| | | | threads), a GPU when its device is CUDA |

``threads`` runs the costly calls (rollout, update, evaluation) of every agent at once, each on a Python
thread of its own with ``torch.get_num_threads() // agents`` torch threads (at least 1). torch releases the
GIL inside its operators, so on CPU two small agents keep both cores busy where ``local`` leaves one idle
(`workbench.agents.forward.agent`): a quickstart step takes 0.64-0.70× ``local``'s (docs/bench.md).
Each agent's calls are the same float operations as under ``local`` at that many threads, so the results
are bit-identical to ``local`` (and ``ray``) at equal torch threads (``tests/test_executors.py``). Agents
on one GPU share it at once, as under Ray: the memory plan gives each an equal share of the device
(`workbench.train.plan`; not yet measured on a GPU).

Placement under Ray: an agent whose ``device`` is ``cuda``, ``cuda:N`` or ``auto`` (on a cluster with GPUs)
asks for ``ray.gpus_per_agent`` GPUs (default 1) and sees them as ``cuda`` inside its actor (Ray sets
``CUDA_VISIBLE_DEVICES``), so ``cuda:1`` in a config means "a GPU", not "the second one"; a ``cpu`` agent asks
for none. Ray places actors wherever the cluster has room: on one node with several GPUs each agent gets its
own GPU; across nodes (``ray start --head`` / ``ray start --address``) an agent may land on any node that
holds the same environment.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import torch

import workbench.train.exchange as exchange
from workbench.config.agent_spec import AgentSpec
from workbench.config.experiment import ExperimentConfig
from workbench.config.sections import RayConfig
from workbench.train.plan import AgentFacts, ExperimentPlan, plan_experiment
from workbench.train.settings import WorkerArgs
from workbench.train.worker import AgentWorker

__all__ = [
    "EXECUTORS",
    "Executor",
    "InProcessExecutor",
    "RayExecutor",
    "RayOptions",
    "make_executor",
    "start_workers",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("local", "threads", "ray")
"""Valid values of the ``executor`` config field."""

FORWARDED_ENV = (
    "HACPO_CACHE",
    "HACPO_TINY_WARM_STEPS",
    "HACPO_DATA_DIR",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS",
)
"""Environment variables of the driver that Ray actors get too (caches, offline switches, threads)."""


class Executor(Protocol):
    """The agents' workers as the driver calls them: every method runs on every agent, results in agent order.

    Each list argument holds one request per agent; each result one report per agent. A worker's own
    exception (a `workbench.train.update.TrainingError`...) reaches the caller as itself.
    """

    def rollout(self, requests: list[exchange.RolloutRequest]) -> list[exchange.RolloutReport]:
        """`AgentWorker.rollout` of every agent: sample, then score with the old policy."""
        ...

    def update(self, requests: list[exchange.UpdateRequest]) -> list[exchange.UpdateReport]:
        """`AgentWorker.update` of every learner: its batch, then its mini-batch updates."""
        ...

    def evaluate(self, request: exchange.EvalRequest) -> list[exchange.EvalReport]:
        """`AgentWorker.evaluate` of every agent on the same held-out set."""
        ...

    def state_dicts(self) -> list[exchange.WorkerState]:
        """`AgentWorker.state_dict` of every agent (weights and optimizer state, on CPU)."""
        ...

    def load_state_dicts(self, states: list[exchange.WorkerState]) -> None:
        """`AgentWorker.load_state_dict` of every agent."""
        ...

    def start_weights(self) -> list[str]:
        """`AgentWorker.start_weights` of every agent: the digest of its weights as loaded."""
        ...

    def memory_facts(self, prompts: list[str]) -> list[AgentFacts]:
        """`AgentWorker.memory_facts` of every agent: what the memory plan needs to know of it."""
        ...

    def use_memory_budgets(self, budgets: list[int]) -> None:
        """`AgentWorker.use_memory_budget` of every agent: the bytes its batches may use."""
        ...

    def close(self) -> None:
        """Release the workers."""
        ...


class InProcessExecutor:
    """Every worker in the trainer's process: called one after another (``local``), or, with ``parallel``,
    rollout, update and evaluation of all agents at once on a thread each (``threads``).

    The workers are built one after another in the calling thread either way (their adapters'
    initialization draws from torch's global generator), and the cheap calls (state dicts, memory facts)
    stay one after another; only `_each` differs.

    Args:
        workers: One `WorkerArgs` per agent.
        parallel: Run the costly calls of all agents at once, a thread each.
        threads: torch's intra-op threads of each agent's thread when parallel; None = the caller's
            threads // agents, at least 1.
    """

    def __init__(self, workers: Sequence[WorkerArgs], *, parallel: bool = False, threads: int | None = None):
        self.workers = [AgentWorker.build(args) for args in workers]
        self.parallel = parallel
        self.threads = threads or max(1, torch.get_num_threads() // len(self.workers))
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(len(self.workers), thread_name_prefix="agent")
            if parallel
            else None
        )

    def _each(self, call: Callable[[AgentWorker, T], R], items: Sequence[T]) -> list[R]:
        """``call(worker, item)`` for every worker, results in agent order: one after another, or at once.

        At once, a worker's exception is raised (the first agent's first) once every other call has ended,
        so that no agent is still training when the caller handles it.
        """
        if self._pool is None:
            return [call(w, item) for w, item in zip(self.workers, items, strict=True)]

        def on_agent_thread(worker: AgentWorker, item: T) -> R:
            if torch.get_num_threads() != self.threads:  # per thread in OpenMP; set once per pool thread
                torch.set_num_threads(self.threads)
            return call(worker, item)

        caller_threads = torch.get_num_threads()
        futures = [
            self._pool.submit(on_agent_thread, w, item) for w, item in zip(self.workers, items, strict=True)
        ]
        try:
            concurrent.futures.wait(futures)
        finally:  # also on Ctrl-C: `close` then waits for the calls still running
            # torch also keeps a process-wide count (new threads start with it): the caller's again.
            torch.set_num_threads(caller_threads)
        return [f.result() for f in futures]

    def rollout(self, requests: list[exchange.RolloutRequest]) -> list[exchange.RolloutReport]:
        """See `Executor.rollout`."""
        return self._each(AgentWorker.rollout, requests)

    def update(self, requests: list[exchange.UpdateRequest]) -> list[exchange.UpdateReport]:
        """See `Executor.update`."""
        return self._each(AgentWorker.update, requests)

    def evaluate(self, request: exchange.EvalRequest) -> list[exchange.EvalReport]:
        """See `Executor.evaluate`."""
        return self._each(AgentWorker.evaluate, [request] * len(self.workers))

    def state_dicts(self) -> list[exchange.WorkerState]:
        """See `Executor.state_dicts`."""
        return [w.state_dict() for w in self.workers]

    def load_state_dicts(self, states: list[exchange.WorkerState]) -> None:
        """See `Executor.load_state_dicts`."""
        for w, state in zip(self.workers, states, strict=True):
            w.load_state_dict(state)

    def start_weights(self) -> list[str]:
        """See `Executor.start_weights`."""
        return [w.start_weights() for w in self.workers]

    def memory_facts(self, prompts: list[str]) -> list[AgentFacts]:
        """See `Executor.memory_facts`."""
        return [w.memory_facts(prompts) for w in self.workers]

    def use_memory_budgets(self, budgets: list[int]) -> None:
        """See `Executor.use_memory_budgets`."""
        for w, budget in zip(self.workers, budgets, strict=True):
            w.use_memory_budget(budget)

    def close(self) -> None:
        """Ends the agents' threads (when parallel), after the calls still running (an interrupted step's)
        have ended, and stops what their engines run (a vLLM server each)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        for worker in self.workers:
            worker.close()


@dataclasses.dataclass(frozen=True)
class RayOptions:
    """How the Ray executor connects and what each agent's actor asks for."""

    address: str | None = None
    """None: join ``$RAY_ADDRESS`` if set, else start a local Ray; ``auto``: the running cluster; or
    ``ray://host:10001`` / ``host:6379``."""
    cpus_per_agent: float = 1.0
    """CPUs each agent's actor reserves; its torch threads = max(1, int(cpus_per_agent))."""
    gpus_per_agent: float | None = None
    """GPUs each CUDA agent reserves; None = 1 for an agent on ``cuda``/``cuda:N``/``auto`` (when the cluster
    has GPUs), 0 on ``cpu``. Fractions (0.5) let two small agents share a GPU."""

    @classmethod
    def from_config(cls, section: RayConfig) -> RayOptions:
        """The options of the config's validated ``ray`` section."""
        return cls(section.address, section.cpus_per_agent, section.gpus_per_agent)


def _agent_gpus(spec: AgentSpec, options: RayOptions, cluster_gpus: float) -> float:
    wants_cuda = spec.device.startswith("cuda") or (spec.device == "auto" and cluster_gpus > 0)
    if not wants_cuda:
        return 0.0
    return 1.0 if options.gpus_per_agent is None else options.gpus_per_agent


def actor_spec(spec: AgentSpec, gpus: float) -> AgentSpec:
    """The spec an actor loads: ``cuda:N`` becomes ``cuda`` (the actor sees only its own GPUs)."""
    if gpus > 0 and spec.device.startswith("cuda:"):
        log.info(
            "agent %s: device %s is 'cuda' in its Ray actor (Ray assigns the GPU)", spec.model, spec.device
        )
    return dataclasses.replace(spec, device="cuda") if gpus > 0 else spec


def _shortfall(need: dict[str, float], have: dict[str, float]) -> str:
    return ", ".join(
        f"{n:g} {k} but {have.get(k, 0.0):g}" for k, n in need.items() if n > have.get(k, 0.0) + 1e-9
    )


def _check_room(ray: Any, need: dict[str, float], wait_s: float = 30.0) -> None:
    """Raises before any actor starts when the cluster cannot hold them (actors would wait forever).

    Resources still held (an earlier trainer's actors being released) get ``wait_s`` seconds to come free.
    """
    if short := _shortfall(need, ray.cluster_resources()):
        raise RuntimeError(
            f"executor: ray: the agents need {short} in the whole Ray cluster; lower ray.cpus_per_agent / "
            "ray.gpus_per_agent, or add nodes (ray start --address ...)"
        )
    deadline = time.monotonic() + wait_s
    while (short := _shortfall(need, ray.available_resources())) and time.monotonic() < deadline:
        time.sleep(0.5)
    if short:
        raise RuntimeError(
            f"executor: ray: the agents need {short} free after {wait_s:g} s: other actors hold them (an "
            "earlier Trainer in this process? Trainer.close() releases its actors, or ray.shutdown())"
        )


class RayExecutor:
    """One Ray actor per agent; every call goes to all actors at once and waits for every result.

    Args:
        worker_kwargs: `AgentWorker` arguments per agent (``spec``, ``index``, ``names``, ``settings``).
        options: Connection and per-agent resources.
        seed: Seeds each actor's global RNGs before it loads its agent.

    Raises:
        RuntimeError: The cluster cannot hold the requested actors (names what was asked and what exists).
    """

    def __init__(self, workers: Sequence[WorkerArgs], options: RayOptions, *, seed: int) -> None:
        import ray

        if not ray.is_initialized():
            env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
            ray.init(address=options.address, runtime_env={"env_vars": env}, include_dashboard=False)
        gpus_A = [
            _agent_gpus(args.spec, options, ray.cluster_resources().get("GPU", 0.0)) for args in workers
        ]
        _check_room(ray, {"CPU": options.cpus_per_agent * len(workers), "GPU": sum(gpus_A)})
        threads = max(1, int(options.cpus_per_agent))
        remote = ray.remote(AgentWorker)
        self.actors = [
            remote.options(num_cpus=options.cpus_per_agent, num_gpus=gpus).remote(
                actor_spec(args.spec, gpus), args.index, args.names, args.settings, seed=seed, threads=threads
            )
            for args, gpus in zip(workers, gpus_A)
        ]
        for where in self._gather([actor.ready.remote() for actor in self.actors]):
            log.info("ray actor ready: %s", where)

    def rollout(self, requests: list[exchange.RolloutRequest]) -> list[exchange.RolloutReport]:
        """See `Executor.rollout` (all actors at once)."""
        return self._gather([a.rollout.remote(r) for a, r in zip(self.actors, requests, strict=True)])

    def update(self, requests: list[exchange.UpdateRequest]) -> list[exchange.UpdateReport]:
        """See `Executor.update` (all actors at once)."""
        return self._gather([a.update.remote(r) for a, r in zip(self.actors, requests, strict=True)])

    def evaluate(self, request: exchange.EvalRequest) -> list[exchange.EvalReport]:
        """See `Executor.evaluate` (all actors at once)."""
        return self._gather([a.evaluate.remote(request) for a in self.actors])

    def state_dicts(self) -> list[exchange.WorkerState]:
        """See `Executor.state_dicts`."""
        return self._gather([a.state_dict.remote() for a in self.actors])

    def load_state_dicts(self, states: list[exchange.WorkerState]) -> None:
        """See `Executor.load_state_dicts`."""
        self._gather([a.load_state_dict.remote(s) for a, s in zip(self.actors, states, strict=True)])

    def start_weights(self) -> list[str]:
        """See `Executor.start_weights`."""
        return self._gather([a.start_weights.remote() for a in self.actors])

    def memory_facts(self, prompts: list[str]) -> list[AgentFacts]:
        """See `Executor.memory_facts`."""
        return self._gather([a.memory_facts.remote(prompts) for a in self.actors])

    def use_memory_budgets(self, budgets: list[int]) -> None:
        """See `Executor.use_memory_budgets`."""
        self._gather([a.use_memory_budget.remote(b) for a, b in zip(self.actors, budgets, strict=True)])

    @staticmethod
    def _gather(refs: list[Any]) -> list[Any]:
        """Every actor's result, in order; re-raises a worker's own exception (not Ray's wrapper)."""
        import ray

        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise

    def close(self) -> None:
        """Ends the actors (their agents' memory is freed); Ray itself keeps running."""
        import ray

        with contextlib.suppress(Exception):  # an actor that died has nothing left to stop
            ray.get([actor.close.remote() for actor in self.actors], timeout=120)
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def make_executor(
    kind: str, workers: Sequence[WorkerArgs], *, seed: int, ray_options: RayOptions | None = None
) -> Executor:
    """The executor named by ``kind`` (`EXECUTORS`) holding a worker per `WorkerArgs`."""
    if kind in ("local", "threads"):
        return InProcessExecutor(workers, parallel=kind == "threads")
    if kind == "ray":
        return RayExecutor(workers, ray_options or RayOptions(), seed=seed)
    raise ValueError(f"executor = {kind!r} is not allowed: one of {list(EXECUTORS)}")


def start_workers(
    cfg: ExperimentConfig, prompts: list[str], *, kind: str | None = None
) -> tuple[Executor, ExperimentPlan]:
    """Every agent of ``cfg`` loaded in its worker (``kind``, None = ``cfg.executor``), with the bytes its
    generation and evaluation batches may use: one memory plan (`workbench.train.plan`, returned too) gives
    each agent its device's ``train.memory_fraction``, less the runtime and every agent's weights and
    optimizer state, measured at the longest of ``prompts``."""
    executor = make_executor(
        kind or cfg.executor,
        WorkerArgs.of_experiment(cfg),
        seed=cfg.seed,
        ray_options=RayOptions.from_config(cfg.ray),
    )
    plan = plan_experiment(cfg, executor.memory_facts(prompts))
    executor.use_memory_budgets(plan.budgets)
    for warning in plan.warnings:
        log.warning("memory plan: %s", warning)
    return executor, plan
