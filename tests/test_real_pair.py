"""The real heterogeneous pair: SmolLM2-135M-Instruct ↔ Gemma-3-270M share text without losing answers, and
the recipe's pieces (warm starts, length cap, prompt format) fit together."""

from __future__ import annotations

import pytest

from workbench.agents.forward.sharing import reencode_response
from workbench.agents.models.loading import load_agent
from workbench.agents.models.warm import WARM_STARTS
from workbench.config.agent_spec import AgentSpec
from workbench.config.loading import load_experiment
from workbench.core.env import PROJECT_ROOT
from workbench.core.types import Rollout
from workbench.tasks.arithmetic import REGIMES, embedded_solution, embedded_task
from workbench.tasks.rewards import grade
from workbench.train.preflight import warm_start_mismatches

REAL_PAIR = PROJECT_ROOT / "experiments" / "real_pair.yaml"
SYSTEM = WARM_STARTS["smollm2-addsub2"].system

RESPONSES = [
    ("94+30=124, 124-60=64, 64-44=20. \\boxed{20}", "20"),
    ("73+87=160. \\boxed{160}", "160"),
    ("The answer is 12.\n\n\\boxed{12}", "12"),
    ("  leading spaces, a tab\tand <eos> or <|im_end|> as plain text: \\boxed{7}", "7"),
]


@pytest.fixture(scope="module")
def real_pair(smollm2_dir, gemma3_dir):
    """SmolLM2 (ChatML with the warm start's system turn) and Gemma-3 (plain Q/A), base weights."""
    smol = load_agent(AgentSpec(model=str(smollm2_dir), name="smollm2", system=SYSTEM, max_new_tokens=48))
    gemma = load_agent(AgentSpec(model=str(gemma3_dir), name="gemma3", max_new_tokens=48))
    return smol, gemma


@pytest.mark.slow
@pytest.mark.parametrize("text, answer", RESPONSES)
def test_reencoding_keeps_the_text_and_the_graded_answer_both_ways(real_pair, text, answer):
    for source, learner in (real_pair, real_pair[::-1]):
        prompt = "94+30-60-44"
        ids = [*source.tokenizer.encode(text, add_special_tokens=False), source.eos_token_id]
        rollout = Rollout(0, 0, 0, prompt, text, source.encode_prompt(prompt), ids, "eos")
        prompt_ids, response_ids, counts = reencode_response(learner, rollout)
        assert prompt_ids == learner.encode_prompt(prompt)
        assert response_ids[-1] == learner.eos_token_id
        back = learner.tokenizer.decode(response_ids[:-1], skip_special_tokens=False)
        assert back == text, (source.name, learner.name)
        assert counts == {"unknown_chars": 0, "truncated": 0, "empty": 0, "lossy": 0}
        assert grade(back, answer).reward == grade(text, answer).reward == 1.0


@pytest.mark.slow
def test_every_worked_solution_fits_the_recipes_length_cap(real_pair):
    cfg = load_experiment(REAL_PAIR)
    items = embedded_task("train", 2000, seed=0, **cfg.task.knobs)
    longest = max(items, key=lambda item: len(item.solution)).solution
    regime = REGIMES[cfg.task.knobs["regime"]]  # the longest sum: the largest operand, every operation
    worst, _ = embedded_solution("+".join([str(regime.max_operand)] * (regime.n_ops[1] + 1)))
    for agent in real_pair:
        lengths = [len(agent.tokenizer.encode(s, add_special_tokens=False)) + 1 for s in (longest, worst)]
        assert max(lengths) <= cfg.train.max_new_tokens, (agent.name, lengths)


def test_the_recipe_prompts_each_agent_as_its_warm_start_was_trained():
    cfg = load_experiment(REAL_PAIR)
    assert [spec.model for spec in cfg.agents] == ["warm:smollm2-addsub2", "warm:gemma3-addsub2"]
    assert warm_start_mismatches(cfg) == []
    changed = load_experiment(REAL_PAIR, {"agents.0.system": None, "task.instruction": "Think."})
    smol, gemma = warm_start_mismatches(changed)  # the instruction is both agents' prompt
    assert smol.startswith("agents[0]") and "system = None" in smol and "task.instruction = 'Think.'" in smol
    assert gemma.startswith("agents[1]") and "system" not in gemma and "task.instruction" in gemma
    # the problems asked are not the prompt format: other knobs than the warm start's are not flagged
    assert WARM_STARTS["smollm2-addsub2"].knobs != dict(cfg.task.knobs)
    assert warm_start_mismatches(load_experiment(REAL_PAIR, {"task.knobs.regime": "addsub2"})) == []
