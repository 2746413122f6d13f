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
import subprocess
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


# -- the fleet's database password: from the environment, never on a command line --------

SECRET = "s3cret-pw"
# Every command the CI scripts run that is not a shell builtin, each a stub that logs
# its command line (and, for blocktable, whether REDIS_PASSWORD reached it).
STUB = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
if [ "$(basename "$0")" = blocktable ]; then echo "REDIS_PASSWORD=${REDIS_PASSWORD:-}" >> "$CALLS"; fi
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && : > "$3/bin/activate"; fi
if [ "$3" = list ]; then echo "numpy 2.0"; fi
"""
STUBS = ("python3", "python", "ruff", "mypy", "pytest", "blocktable", "redis-server", "apt-get", "sudo")


def fake_checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of ci/ in a folder laid out as a checkout, and an environment whose
    PATH finds a stub for every command the scripts run (nothing is installed)."""
    root = tmp_path / "checkout"
    (root / "ci").mkdir(parents=True)
    for script in (ROOT / "ci").glob("*.sh"):
        (root / "ci" / script.name).write_text(script.read_text())
    for folder in ("blocktable", "reference", "kernels", "properties"):
        (root / folder).mkdir()
    (root / "pyproject.toml").write_text("")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in STUBS:
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    return root, {"PATH": f"{stubs}:/usr/bin:/bin", "CALLS": str(tmp_path / "calls.txt"), "HOME": str(tmp_path)}


CI_RUNS = {"cpu.sh": [], "gpu.sh": [], "nightly.sh": ["cpu", "7"]}


def run_ci(tmp_path: Path, script: str, database: str) -> tuple[int, str, str]:
    """Run a CI script in the stubbed checkout: (its status, what it printed, the command lines it ran)."""
    root, env = fake_checkout(tmp_path)
    env.update(BLOCKTABLE_DATABASE=database, REDIS_PASSWORD=SECRET)
    done = subprocess.run(["bash", str(root / "ci" / script), *CI_RUNS[script]], capture_output=True, text=True,
                          env=env, timeout=120)
    calls = Path(env["CALLS"])
    return done.returncode, done.stdout + done.stderr, calls.read_text() if calls.exists() else ""


@pytest.mark.parametrize("script", CI_RUNS)
def test_the_ci_scripts_give_blocktable_the_password_by_the_environment_only(tmp_path, script):
    code, out, calls = run_ci(tmp_path, script, "redis://10.0.0.5:6379/0")
    assert code == 0, out + calls
    fuzz = [line for line in calls.splitlines() if line.startswith("blocktable fuzz")]
    assert fuzz and all("--database redis://10.0.0.5:6379/0" in line for line in fuzz), calls
    assert f"REDIS_PASSWORD={SECRET}" in calls.splitlines()
    assert SECRET not in "\n".join(line for line in calls.splitlines() if not line.startswith("REDIS_PASSWORD="))


@pytest.mark.parametrize("database", ["redis://:s3cret-pw@10.0.0.5:6379/0", "rediss://fleet:s3cret-pw@10.0.0.5/1",
                                      "redis://:s3c/ret@pw@10.0.0.5:6379/0"])
@pytest.mark.parametrize("script", CI_RUNS)
def test_a_database_url_holding_a_password_stops_the_ci_scripts_before_anything_runs(tmp_path, script, database):
    code, out, calls = run_ci(tmp_path, script, database)
    assert code == 2, out + calls
    assert out == ("ci: BLOCKTABLE_DATABASE holds a password: set it as redis://HOST:PORT/N and the password in "
                   "REDIS_PASSWORD (docs/fleet.md)\n")
    assert calls == ""  # nothing ran, nothing was installed


@pytest.mark.parametrize("name", EXPECTED)
def test_the_workflows_pass_the_password_as_its_own_secret(name):
    env = yaml.safe_load((WORKFLOWS / name).read_text())["env"]
    assert env == {"BLOCKTABLE_DATABASE": "${{ secrets.BLOCKTABLE_DATABASE }}",
                   "REDIS_PASSWORD": "${{ secrets.REDIS_PASSWORD }}"}
