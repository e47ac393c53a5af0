"""Layer 1: problems, prompts, rewards and metrics. No torch.

`load_tasks` reads every source (embedded arithmetic, reasoning-gym, local files, the paper's benchmarks);
`workbench.tasks.rewards.grade_batch` verifies answers; `workbench.tasks.metrics` holds pass@k and friends.
"""

from workbench.tasks.arithmetic import embedded_task
from workbench.tasks.prompts import PAPER_INSTRUCTION, build_prompt
from workbench.tasks.rewards import grade, grade_batch
from workbench.tasks.sources import load_tasks

__all__ = ["PAPER_INSTRUCTION", "build_prompt", "embedded_task", "grade", "grade_batch", "load_tasks"]
