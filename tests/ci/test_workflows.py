"""The CI workflows say what runs on every push and every night, so they are
checked like code. GitHub Actions reads workflows from `.github/workflows/` only;
each of ours calls a script under `ci/`. This test parses every workflow, checks
the shape GitHub reads (jobs, a runner, steps that either run or use), and checks
that every command exists: the files a `run:` line or a CI script names (scripts,
sourced files), the extras `pip install` asks for, and every `blocktable`
subcommand and flag, against the real argument parser.

A checker that cannot fail proves nothing: the last test feeds it a broken
workflow and expects each fault to be named.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import yaml

from blocktable.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
EXPECTED = ("cpu.yml", "gpu.yml", "nightly.yml")
OPERATORS = {"&&", "||", ";", "|", "&", ";;", "(", ")"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1", "&>"}
# A token that names a file of the repository: a relative path with a folder in it,
# or a script by extension. Tokens with shell expansions ($...) are left alone.
REPO_PATH = re.compile(r"^(\./)?[\w.-]+(/[\w.-]+)+/?$|^[\w.-]+\.(sh|py)$")


def blocktable_options() -> dict[str, set[str]]:
    """Every `blocktable` subcommand with the option strings it accepts."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: set(p._option_string_actions) for name, p in sub.choices.items()}


def extras() -> set[str]:
    """The optional-dependency groups pyproject.toml declares."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: read the one table by hand
        text = (ROOT / "pyproject.toml").read_text()
        table = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
        return set(re.findall(r"^([\w-]+)\s*=", table.group(1), re.M)) if table else set()
    with open(ROOT / "pyproject.toml", "rb") as f:
        return set(tomllib.load(f)["project"].get("optional-dependencies", {}))


def simple_commands(text: str) -> list[list[str]]:
    """Shell text as simple commands (lists of words), split at newlines and at
    `&&`, `||`, `;`, `|`. GitHub's `${{ ... }}` expressions become a placeholder."""
    text = re.sub(r"\$\{\{.*?\}\}", "EXPR", text).replace("\\\n", " ")
    commands: list[list[str]] = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            words = list(lexer)
        except ValueError:  # an unbalanced quote in an odd line: plain words still show paths and flags
            words = line.split()
        current: list[str] = []
        for word in words:
            if word in OPERATORS:
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
        if current:
            commands.append(current)
    return commands


def command_problems(text: str, where: str, seen: set[Path] | None = None) -> list[str]:
    """What is wrong with the commands in `text` (a `run:` block or a CI script):
    missing files, unknown pip extras, unknown `blocktable` subcommands or flags.
    Scripts under ci/ that it names are checked in turn."""
    seen = set() if seen is None else seen
    options = blocktable_options()
    problems: list[str] = []
    for words in simple_commands(text):
        words = [w for w in words if w not in REDIRECTS]
        for word in words:
            if "$" in word or "://" in word or word.startswith(("/", "-")):
                continue
            extra = re.fullmatch(r"\.\[([\w,-]+)\]", word)
            if extra:
                for name in extra.group(1).split(","):
                    if name not in extras():
                        problems.append(f"{where}: pip extra {name!r} is not in pyproject.toml")
                continue
            if REPO_PATH.match(word):
                path = ROOT / word
                if not path.exists():
                    problems.append(f"{where}: {word} does not exist in the repository")
                elif path.suffix == ".sh" and path.resolve() not in seen:
                    seen.add(path.resolve())
                    problems += command_problems(path.read_text(), word, seen)
        problems += blocktable_problems(words, options, where)
    return problems


def blocktable_problems(words: list[str], options: dict[str, set[str]], where: str) -> list[str]:
    if "blocktable" not in words:
        return []
    rest = words[words.index("blocktable") + 1:]
    if not rest or rest[0] not in options:
        return [f"{where}: `blocktable {rest[0] if rest else ''}` is not a subcommand "
                f"(known: {', '.join(sorted(options))})"]
    command, args = rest[0], rest[1:]
    flags = [f.split("=")[0] for word in args for f in re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*(?:=\S*)?", word)]
    return [f"{where}: `blocktable {command}` has no option {flag}" for flag in flags
            if flag not in options[command]]


def workflow_problems(text: str, where: str) -> list[str]:
    """The shape GitHub Actions reads, then every `run:` command."""
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        return [f"{where}: not a mapping"]
    problems = []
    if "on" not in data and True not in data:  # YAML 1.1 reads the key `on` as True
        problems.append(f"{where}: no `on:` trigger")
    jobs = data.get("jobs")
    if not isinstance(jobs, dict) or not jobs:
        return problems + [f"{where}: no jobs"]
    for job_name, job in jobs.items():
        at = f"{where} job {job_name}"
        if not isinstance(job, dict) or "runs-on" not in job:
            problems.append(f"{at}: no runs-on")
            continue
        steps = job.get("steps")
        if not isinstance(steps, list) or not steps:
            problems.append(f"{at}: no steps")
            continue
        for number, step in enumerate(steps, 1):
            kinds = [k for k in ("run", "uses") if k in (step or {})]
            if len(kinds) != 1:
                problems.append(f"{at} step {number}: needs exactly one of run and uses, has {kinds or 'neither'}")
            elif kinds == ["uses"] and "@" not in str(step["uses"]):
                problems.append(f"{at} step {number}: action {step['uses']} is not pinned to a version")
            elif kinds == ["run"]:
                problems += command_problems(str(step["run"]), f"{at} step {number}")
    return problems


def run_commands(path: Path) -> list[str]:
    data = yaml.safe_load(path.read_text())
    return [str(step["run"]) for job in data["jobs"].values() for step in job["steps"] if "run" in step]


def test_the_workflows_are_where_github_reads_them():
    assert sorted(p.name for p in WORKFLOWS.glob("*.yml")) == sorted(EXPECTED)
    assert not list((ROOT / "ci").glob("*.yml")), "GitHub runs workflows from .github/workflows/ only"


@pytest.mark.parametrize("name", EXPECTED)
def test_every_command_a_workflow_runs_exists(name):
    assert workflow_problems((WORKFLOWS / name).read_text(), name) == []


@pytest.mark.parametrize("name", EXPECTED)
def test_every_workflow_step_calls_a_script_under_ci(name):
    commands = run_commands(WORKFLOWS / name)
    assert commands
    for command in commands:
        assert re.fullmatch(r"bash ci/[\w-]+\.sh( .*)?", command.strip()), command


@pytest.mark.parametrize("script", sorted((ROOT / "ci").glob("*.sh")), ids=lambda p: p.name)
def test_every_ci_script_runs_commands_that_exist(script):
    """ci/gpu-check.sh is run by hand on a GPU machine, not by a workflow: checked too."""
    assert command_problems(script.read_text(), f"ci/{script.name}") == []


def test_the_cpu_job_installs_cpu_torch_before_the_package():
    setup = (ROOT / "ci" / "env.sh").read_text()
    cpu_torch = setup.index("torch --index-url https://download.pytorch.org/whl/cpu")
    assert cpu_torch < setup.index("-e '.[test,lint]'")
    assert "ci_setup cpu" in (ROOT / "ci" / "cpu.sh").read_text()
    assert "pytest -n auto" in (ROOT / "ci" / "cpu.sh").read_text()


def test_the_checker_names_every_fault_of_a_broken_workflow():
    broken = """
name: broken
on: [push]
jobs:
  a:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout
      - run: bash ci/no-such-script.sh
      - run: pip install -e '.[tests]' && blocktable fuzzz
      - run: blocktable fuzz --minuets 3 --seed ${{ github.run_number }}
      - name: neither run nor uses
  b:
    steps: []
"""
    problems = "\n".join(workflow_problems(broken, "broken.yml"))
    for fault in ("actions/checkout is not pinned", "ci/no-such-script.sh does not exist",
                  "pip extra 'tests'", "`blocktable fuzzz` is not a subcommand",
                  "`blocktable fuzz` has no option --minuets", "step 5: needs exactly one of run and uses",
                  "job b: no runs-on"):
        assert fault in problems, f"{fault!r} not reported in:\n{problems}"
    assert "--seed" not in problems
