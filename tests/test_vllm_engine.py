"""The vLLM rollout engine: merged policy weights, the server's life, greedy agreement with the built-in loop,
and a sync that really changes what the engine samples.

Tests marked ``engine`` need the engine environment (``make engine``; `.ci/run` builds it) and skip, with that
reason, where it is missing. They serve the embedded SmolLM2-135M (a real model: vLLM cannot serve the tiny
presets' 16-wide attention heads) with a LoRA adapter, in fp32, without vLLM's compilation.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import signal
import time

import pytest
import torch

from workbench.agents.forward.merged import merged_state_dict, write_policy
from workbench.agents.generation.engine import check_rollouts
from workbench.agents.generation.rollout import generate
from workbench.agents.generation.vllm_engine import EngineError, EngineServer, VLLMEngine, engine_python
from workbench.agents.models.loading import load_agent
from workbench.train.batches import UpdateSettings
from workbench.train.scoring import sampler_log_ratios, score_own


def _engine_python():
    try:
        return engine_python()
    except EngineError as exc:
        return pytest.skip(f"no vLLM engine environment ({exc})", allow_module_level=False)


def _perturb_lora(agent, scale: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in agent.model.named_parameters():
            if "lora_B" in name:
                param.copy_(scale * torch.randn(param.shape, generator=generator))


# One worker of `pytest -n` runs these tests, in order: one server at a time, the module's shared.
pytestmark = pytest.mark.xdist_group("engine")

PROMPTS = [f"What is {a} + {b} * {c}? Put the answer in \\boxed{{}}." for a, b, c in
           [(3, 4, 5), (7, 2, 9), (1, 8, 6), (9, 9, 2), (5, 0, 7), (2, 6, 3), (8, 1, 4), (6, 7, 1),
            (4, 3, 8), (0, 5, 5), (9, 2, 7), (3, 3, 3), (7, 8, 2), (1, 1, 9), (6, 4, 6), (2, 9, 1),
            (5, 5, 4), (8, 6, 0), (4, 7, 7), (0, 2, 8)]]  # fmt: skip


@pytest.fixture(scope="module")
def lora_smollm2(smollm2_dir):
    """SmolLM2-135M with a LoRA adapter whose B is not zero (so merging changes the weights)."""
    agent = load_agent(
        {"model": str(smollm2_dir), "name": "smollm2", "lora": {"r": 8, "alpha": 16}, "max_new_tokens": 40}
    )
    _perturb_lora(agent, 0.02, seed=0)
    return agent


def test_merged_weights_equal_peft_merge_and_leave_the_model_alone(bpe_agent_dir):
    agent = load_agent({"model": str(bpe_agent_dir), "name": "bpe", "lora": {"r": 4, "alpha": 8}})
    _perturb_lora(agent, 0.1, seed=1)
    before = agent.weights_digest()
    merged = merged_state_dict(agent)
    reference = copy.deepcopy(agent.model).merge_and_unload().state_dict()
    assert agent.weights_digest() == before  # training goes on with the same adapters
    assert set(merged) == set(reference)
    base = dict(agent.model.get_base_model().named_parameters())
    changed = 0
    for key, value in reference.items():
        torch.testing.assert_close(merged[key], value, rtol=0, atol=1e-6)
        original = base.get(key.replace(".weight", ".base_layer.weight"))
        changed += original is not None and not torch.equal(original, value)
    assert changed > 0  # the adapters were folded in somewhere


def test_a_4bit_agents_policy_is_its_dequantized_base_plus_the_adapters(bpe_agent_dir, tmp_path):
    """What the engine loads for a QLoRA agent: a plain model whose logits are the 4-bit trainer's."""
    from transformers import AutoModelForCausalLM

    agent = load_agent({"model": str(bpe_agent_dir), "name": "q", "quantization": "4bit", "lora": {"r": 4}})
    _perturb_lora(agent, 0.1, seed=1)
    folder = write_policy(agent, tmp_path / "policy")
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([agent.encode_prompt(p) for p in PROMPTS[:1]])
    with torch.no_grad():
        trainer = agent.model(input_ids=ids).logits
        served = plain(input_ids=ids).logits
        base = load_agent({"model": str(bpe_agent_dir), "name": "b"}).model(input_ids=ids).logits
    torch.testing.assert_close(served, trainer, rtol=0, atol=1e-4)
    assert (served - base).abs().max() > 1e-2  # not the unquantized base: the nf4 weights and the adapters


def test_an_8bit_agent_has_no_merged_policy(bpe_agent_dir):
    agent = load_agent({"model": str(bpe_agent_dir), "name": "q8", "quantization": "8bit", "lora": {"r": 4}})
    with pytest.raises(ValueError, match="'8bit' has no single full-precision weight"):
        merged_state_dict(agent)


def test_a_failed_servers_log_tail_leads_with_the_first_error_of_each_process(tmp_path):
    server = EngineServer(tmp_path, tmp_path / "python")
    server._folder = tmp_path  # as start() leaves it
    lines = [
        "(Worker pid=7) ERROR [x.py:1] RuntimeError: Unsupported CPU attention configuration: head_dim=16",
        "(Worker pid=7) ERROR [x.py:1] RuntimeError: the same cause, told again",
        "(EngineCore pid=6) ERROR [core.py:2] RuntimeError: Worker failed",
        *[f"(APIServer pid=5) INFO line {i}" for i in range(40)],
    ]
    (tmp_path / "server.log").write_text("\n".join(lines))
    tail = server.log_tail().splitlines()
    assert tail[:3] == [lines[0], lines[2], "..."] and tail[3:] == lines[-30:]


def test_a_missing_engine_environment_names_the_command_that_builds_it(tmp_path):
    with pytest.raises(EngineError, match="make engine"):
        engine_python(tmp_path / "no-such-env")
    (tmp_path / "bare" / "bin").mkdir(parents=True)
    (tmp_path / "bare" / "bin" / "python").touch()
    with pytest.raises(EngineError, match="no vllm package"):
        engine_python(tmp_path / "bare")


@pytest.fixture(scope="module")
def engine_env():
    """The engine environment's Python (the test skips, saying why, without it); ask for it first, so that a
    skipped test loads no model."""
    return _engine_python()


@pytest.fixture(scope="module")
def engine(engine_env, lora_smollm2):
    served = VLLMEngine(lora_smollm2, engine_env, enforce_eager=True, threads=1).start()
    yield served
    served.close()


def _greedy(source, prompts, max_new_tokens=40):
    kwargs = dict(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens, author=0, seed=0)
    if hasattr(source, "server"):
        return source.generate(prompts, 1, **kwargs)
    return generate(source, prompts, 1, **kwargs)


@pytest.mark.engine
@pytest.mark.slow
def test_engine_greedy_answers_equal_the_built_in_loop(engine, lora_smollm2):
    ours = _greedy(lora_smollm2, PROMPTS)
    served = _greedy(engine, PROMPTS)
    check_rollouts(lora_smollm2, PROMPTS, 1, served, author=0, max_new_tokens=40)
    same = sum(a.response_ids == b.response_ids for a, b in zip(ours, served))
    assert same >= 0.95 * len(PROMPTS), [(a.text, b.text) for a, b in zip(ours, served) if a.text != b.text]
    assert [r.finish_reason for r in served] == [r.finish_reason for r in ours]


@pytest.mark.engine
@pytest.mark.slow
def test_sync_makes_the_engine_sample_the_updated_policy(engine, lora_smollm2):
    before = _greedy(engine, PROMPTS[:8])
    saved = {k: v.clone() for k, v in lora_smollm2.model.named_parameters() if "lora_B" in k}
    try:
        _perturb_lora(lora_smollm2, 0.2, seed=2)  # an "update" large enough to change greedy answers
        stale = _greedy(engine, PROMPTS[:8])
        assert [r.response_ids for r in stale] == [r.response_ids for r in before]  # not synced yet
        engine.sync()
        after = _greedy(engine, PROMPTS[:8])
        ours = _greedy(lora_smollm2, PROMPTS[:8])
        assert [r.response_ids for r in after] != [r.response_ids for r in before]
        assert sum(a.response_ids == b.response_ids for a, b in zip(after, ours)) >= 7
    finally:
        with torch.no_grad():
            for name, param in lora_smollm2.model.named_parameters():
                if name in saved:
                    param.copy_(saved[name])
        engine.sync()
    assert [r.response_ids for r in _greedy(engine, PROMPTS[:8])] == [r.response_ids for r in before]


@pytest.mark.engine
@pytest.mark.slow
def test_sampled_rollouts_follow_the_engine_contract_and_the_seed(engine, lora_smollm2):
    kwargs = dict(temperature=1.0, top_p=1.0, max_new_tokens=24, author=1, seed=5)
    first = engine.generate(PROMPTS[:3], 4, **kwargs)
    check_rollouts(lora_smollm2, PROMPTS[:3], 4, first, author=1, max_new_tokens=24)
    again = engine.generate(PROMPTS[:3], 4, **kwargs)
    assert [r.response_ids for r in again] == [r.response_ids for r in first]
    assert len({tuple(r.response_ids) for r in first}) > 3  # samples, not 12 copies of one answer


GAP_MEAN_BOUND, GAP_MAX_BOUND = 1e-3, 0.05
"""Nats a token between vLLM's log-probs of its sampled tokens and the trainer's (fp32 both on CPU; measured
by ``bench/bench_engine.py`` on the real pair's agents: mean ≈ 1.5e-6, max ≈ 1e-4; ``docs/engine.md``)."""


@pytest.mark.engine
@pytest.mark.slow
def test_the_engines_log_probs_of_its_samples_are_the_trainers_within_a_stated_bound(engine, lora_smollm2):
    kwargs = dict(temperature=1.0, top_p=1.0, max_new_tokens=24, author=0, seed=3)
    rollouts = engine.generate(PROMPTS[:6], 4, **kwargs)
    scores = score_own(lora_smollm2, rollouts, UpdateSettings(temperature=1.0))
    gaps_T = torch.cat(sampler_log_ratios(rollouts, scores)).abs()
    assert gaps_T.numel() > 6 * 4, "the samples need tokens"
    assert float(gaps_T.mean()) < GAP_MEAN_BOUND and float(gaps_T.max()) < GAP_MAX_BOUND, (
        float(gaps_T.mean()),
        float(gaps_T.max()),
    )


@pytest.mark.engine
@pytest.mark.slow
def test_a_killed_server_is_a_named_error_and_close_removes_everything(engine):
    """Kills the module's server, last of the tests that use it (a later `generate` would start a new one)."""
    server = engine.server
    folder, pid = server.socket_path.parent, server.pid
    assert oct(folder.stat().st_mode & 0o777) == "0o700" and server.socket_path.is_socket()
    os.kill(pid, signal.SIGKILL)
    server._process.wait(timeout=60)
    with pytest.raises(EngineError, match="not running"):
        engine.generate(PROMPTS[:1], 1, temperature=0.0, top_p=1.0, max_new_tokens=8, author=0, seed=0)
    policy = engine._folders[0].parent
    engine.close()
    assert not folder.exists() and not policy.exists() and engine.server is None


@pytest.mark.engine
@pytest.mark.slow
def test_a_4bit_agent_is_served_from_its_dequantized_base(engine_env, smollm2_dir):
    agent = load_agent(
        {
            "model": str(smollm2_dir),
            "name": "q4",
            "quantization": "4bit",
            "lora": {"r": 8},
            "max_new_tokens": 40,
        }
    )
    _perturb_lora(agent, 0.02, seed=0)
    served = VLLMEngine(agent, engine_env, enforce_eager=True, threads=1).start()
    try:
        ours, theirs = _greedy(agent, PROMPTS[:10]), _greedy(served, PROMPTS[:10])
    finally:
        served.close()
    same = sum(a.response_ids == b.response_ids for a, b in zip(ours, theirs))
    assert same >= 9, [(a.text, b.text) for a, b in zip(ours, theirs) if a.text != b.text]


def _engine_run_overrides(root):
    return [
        "train.engine=vllm",
        "train.engine_eager=true",
        "train.steps=2",
        "train.prompts_per_step=1",
        "train.minibatch_prompts=1",
        "train.save_every=1",
        "task.eval_size=0",
        "executor=local",
        "seeds=[0]",
        f"output.root={root}",
    ]


def _servers(marker: str = "vllm.entrypoints", skip: frozenset[int] = frozenset()) -> list:
    """This process's live vLLM server processes whose command line holds ``marker``."""
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if (
                process.pid not in skip
                and marker in " ".join(process.cmdline())
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(process)
        except psutil.Error:  # a process that ended meanwhile
            pass
    return found


@pytest.fixture
def run_servers():
    """The servers a test's runs start (servers of other tests, e.g. the module's `engine`, are not theirs),
    and a check that none is left."""
    servers = functools.partial(_servers, skip=frozenset(process.pid for process in _servers()))

    def none_left() -> bool:
        for _ in range(30):  # a loaded machine may take a moment to let the killed processes go
            if not servers():
                return True
            time.sleep(2)
        return False

    servers.none_left = none_left
    return servers


@pytest.mark.engine
@pytest.mark.slow
def test_a_server_stops_when_the_process_that_started_it_is_killed_outright(
    engine_env, lora_smollm2, tmp_path
):
    """SIGKILL (the kernel's OOM killer) runs no atexit: the server must still go, not hold its gigabytes."""
    import subprocess
    import sys

    import psutil

    from workbench.core.env import PROJECT_ROOT

    folder = write_policy(lora_smollm2, tmp_path / "policy")
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from workbench.agents.generation.vllm_engine import EngineServer\n"
        "server = EngineServer(Path(sys.argv[1]), Path(sys.argv[2]), enforce_eager=True, threads=1).start()\n"
        "print(server.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    trainer = subprocess.Popen(
        [sys.executable, "-c", script, str(folder), str(engine_env)],
        cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pid = int(trainer.stdout.readline())
        server = psutil.Process(pid)
        assert "vllm.entrypoints" in " ".join(server.cmdline())
        family = [server, *server.children(recursive=True)]  # vLLM's engine core and worker too
        trainer.kill()
        trainer.wait()
        _, alive = psutil.wait_procs(family, timeout=90)
        assert not alive, f"{alive} outlived the killed process that started the server"
    finally:
        trainer.kill()


@pytest.mark.engine
@pytest.mark.slow
def test_a_hacpo_run_of_the_real_pair_samples_with_the_engine(tmp_path, engine_env, run_servers):
    """Two HACPO steps of the real pair, both agents sampling with their own vLLM server."""
    from workbench.core.env import PROJECT_ROOT
    from workbench.train.run import train

    run = train(PROJECT_ROOT / "experiments" / "real_pair.yaml", overrides=_engine_run_overrides(tmp_path))
    assert (run / "DONE").exists()
    assert run_servers.none_left(), run_servers()
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in logged if row["step"] >= 1]
    for name in ("smollm2", "gemma3"):  # the sampler/trainer gap of every agent, every step
        gaps = [row[f"engine/{name}/logp_gap_mean"] for row in trained]
        assert len(gaps) == len(trained) == 2 and all(0 <= g < 1 for g in gaps), (name, gaps)


@pytest.mark.engine
@pytest.mark.slow
def test_a_run_resumes_after_a_killed_server_with_the_weights_of_an_uninterrupted_run(
    tmp_path, engine_env, run_servers
):
    """SmolLM2 alone (the real pair's first agent; one server a run keeps the drill short): its server is
    killed after step 1, the next rollout is a named error, and the resumed run ends with the weights of an
    uninterrupted run."""
    from workbench.core.env import PROJECT_ROOT
    from workbench.train.checkpoint import load_latest_checkpoint
    from workbench.train.run import train

    yaml_path = PROJECT_ROOT / "experiments" / "real_pair_calibration" / "smollm2_gspo.yaml"
    straight = train(yaml_path, overrides=_engine_run_overrides(tmp_path / "straight"))
    assert (straight / "DONE").exists()

    def kill_the_server(metrics):
        if metrics.get("step") == 1:
            for process in run_servers("hacpo-policy-smollm2"):
                process.kill()

    overrides = _engine_run_overrides(tmp_path / "interrupted")
    with pytest.raises(EngineError, match=r"vLLM server of .*smollm2"):  # "not running" or "did not answer"
        train(yaml_path, overrides=overrides, on_step=kill_the_server)
    assert run_servers.none_left(), run_servers()
    resumed = train(yaml_path, overrides=overrides)
    assert (resumed / "DONE").exists()
    assert run_servers.none_left(), run_servers()
    _, a = load_latest_checkpoint(straight)
    _, b = load_latest_checkpoint(resumed)
    agents = [k for k in a if k.startswith("agent_")]
    assert agents and agents == [k for k in b if k.startswith("agent_")]
    for key in agents:
        assert a[key].keys() == b[key].keys()
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), (key, name)
