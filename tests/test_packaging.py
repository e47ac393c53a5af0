"""environment.yml and pyproject.toml name the same pinned packages; the two commands exist."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return set(project["dependencies"]) | set(extras["dev"]) | set(extras["data"])


def test_environment_yml_matches_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml must have exactly one pip section"
    assert set(pip_sections[0]) == _pyproject_requirements()
    assert "python=3.11" in env["dependencies"]


def test_every_requirement_is_pinned_and_torch_is_2_13():
    requirements = _pyproject_requirements()
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[^=]+", r) for r in requirements), requirements
    assert "torch==2.13.0" in requirements


def test_makefile_has_the_two_commands_and_ci_calls_make_test():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
