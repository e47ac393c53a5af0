"""Shared fixtures: a session-wide temporary model cache and quickly built tiny agents.

Every test session caches models under a fresh temporary ``HACPO_CACHE`` (never the user's cache), and tiny
presets are warm-started for only ``HACPO_TINY_WARM_STEPS`` steps (default here: 40) so that any
``load_agent("tiny:<preset>")`` in the suite builds in seconds. Such agents are barely trained; tests that
need the real warm start pass ``warm_steps`` explicitly and are marked ``slow``.
"""

from __future__ import annotations

import os

import pytest

TEST_WARM_STEPS = "40"

# Set before any test module imports torch: 2 cores, and torch's OpenMP spinning slows everything 10-15x.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n 2`: one thread per worker, the two share the cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def hacpo_cache(tmp_path_factory: pytest.TempPathFactory):
    """A temporary ``HACPO_CACHE`` for the whole session, with short tiny-agent warm starts; shared by the
    workers of ``pytest -n`` (pytest-xdist), which build each model once between them
    (`workbench.core.lock.build_once`)."""
    saved = {key: os.environ.get(key) for key in ("HACPO_CACHE", "HACPO_TINY_WARM_STEPS")}
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' temporary folders share one parent
        path = tmp_path_factory.getbasetemp().parent / "hacpo-cache"
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("hacpo-cache")
    os.environ["HACPO_CACHE"] = str(path)
    os.environ["HACPO_TINY_WARM_STEPS"] = saved["HACPO_TINY_WARM_STEPS"] or TEST_WARM_STEPS
    yield path
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def char_agent_dir(hacpo_cache):
    """Model directory of ``tiny:gpt2-char`` (GPT-2, character-level), briefly warm-started."""
    from workbench.agents.models.zoo import build_tiny
    from workbench.core import env

    return build_tiny("gpt2-char", warm_steps=env.tiny_warm_steps())


@pytest.fixture(scope="session")
def bpe_agent_dir(hacpo_cache):
    """Model directory of ``tiny:llama-bpe`` (Llama, byte-level BPE), briefly warm-started."""
    from workbench.agents.models.zoo import build_tiny
    from workbench.core import env

    return build_tiny("llama-bpe", warm_steps=env.tiny_warm_steps())


@pytest.fixture(scope="session")
def char_agent(char_agent_dir):
    """A loaded GPT-2 char agent shared by read-only tests (load your own copy to train it)."""
    from workbench.agents.models.loading import load_agent

    return load_agent(str(char_agent_dir), name="char")


@pytest.fixture(scope="session")
def bpe_agent(bpe_agent_dir):
    """A loaded Llama BPE agent shared by read-only tests (load your own copy to train it)."""
    from workbench.agents.models.loading import load_agent

    return load_agent(str(bpe_agent_dir), name="bpe")


@pytest.fixture(scope="session")
def smollm2_dir(hacpo_cache):
    """The embedded SmolLM2 converted into the session cache (≈25-40 s, once per session)."""
    from workbench.agents.models.shipped import ensure_embedded

    return ensure_embedded("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_dir(hacpo_cache):
    """The embedded Gemma-3-270M converted into the session cache (≈45 s-2 min, once per session)."""
    from workbench.agents.models.shipped import ensure_embedded

    return ensure_embedded("gemma3-270m")


@pytest.fixture
def two_threads():
    """torch's intra-op threads = 2 in the test, the caller's again after (the same figures on any machine:
    two agents get one thread each under ``executor: threads``; small work drops to one)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` skip, with their reason, where torch sees no CUDA device: also when they are
    selected with ``-m gpu``."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False here)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
