"""The README's commands run as written, in a fresh copy of the repository.

A new user copies the Quick start and "Train models for your fleet" blocks into a shell. This
test does the same: it extracts every ```sh block of those sections, in order, and runs them
with bash (`set -euo pipefail`) in a copy of the repository (the files git tracks, plus new
ones not ignored; no `.venv`, no build output), in a shell whose PATH has no virtual
environment, so a command that only works in an activated environment fails here as it would
for the user.

What the test changes, and only that:
- `make test` is skipped: it is the suite running this test;
- `.venv` is the project's environment, already installed (linked, not rebuilt: `make` sees it
  up to date, as after the user's first `make run`);
- a server command (`make run`, `python -m extender ...`) is started in the background, waited
  for until it logs that it listens, and stopped before the next server or at the end; it
  listens on a free port (`PAS_PORT`, which every extender flag reads from the environment)
  and the README's `127.0.0.1:8888` is rewritten to that port;
- `PROMETHEUS=...` points at a real Prometheus holding a synthetic fleet's last 7 days of
  node_exporter and ipmi_exporter series (backfilled with promtool), so the collect and fit
  commands read what they would read in a cluster.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from bench.support.prometheus import backfill
from bench.training_scale import STEP_S, write_exporter_openmetrics
from tests.support.prometheus import free_port, require_prometheus, start_prometheus
from training.dataset import write_metrics
from training.synth import synth_fleet

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SECTIONS = ("Quick start", "Train models for your fleet")
SERVER = re.compile(r"^(make run|python -m extender)(\s|$)")
SKIPPED = ("make test",)  # the suite that runs this test
PROMETHEUS_ASSIGNMENT = re.compile(r"^PROMETHEUS=\S+")
README_PORT = "127.0.0.1:8888"
SCRIPT_TIMEOUT_S = 900
FLEET_NODES = 3
FLEET_HOURS = 168  # the README collects `--start=-7d --end=now`


# ---- the README's commands --------------------------------------------------------------------


def section_blocks(text: str, title: str) -> list[str]:
    """The ```sh blocks of one `## title` section (its subsections included), in order."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, flags=re.M | re.S)
    assert match, f"README.md has no section '## {title}'"
    return re.findall(r"```sh\n(.*?)```", match.group(1), flags=re.S)


def block_commands(block: str) -> list[str]:
    """A block's commands: continuation lines joined, comments and blank lines dropped."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        command = _strip_comment(line).strip()
        if command:
            commands.append(" ".join(command.split()))
    return commands


def _strip_comment(line: str) -> str:
    """`line` without a trailing shell comment (a # outside quotes, after a space)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


def readme_commands() -> list[list[str]]:
    """Per block, its commands, for the sections the README promises run as written."""
    text = README.read_text()
    return [block_commands(block) for title in SECTIONS for block in section_blocks(text, title)]


# Where each command's argument parser lives, when not in the module `python -m` runs.
PARSERS = {
    "extender": "extender.config",
    "training.collect": "training.collect.cli",
    "training.fit": "training.fit.cli",
    "controllers.node_power": "controllers.node_power.cli",
    "controllers.energy_adapter": "controllers.energy_adapter.cli",
}


def other_commands() -> list[str]:
    """The commands of every ```sh block outside the sections the run test runs."""
    text = README.read_text()
    run = "".join(
        match.group(0)
        for title in SECTIONS
        for match in re.finditer(rf"^## {re.escape(title)}\n.*?(?=^## )", text, flags=re.M | re.S)
    )
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    kept = set(re.findall(r"```sh\n(.*?)```", run, flags=re.S))
    return [command for block in blocks if block not in kept for command in block_commands(block)]


def test_the_readme_commands_outside_the_run_sections_are_real() -> None:
    # A cluster is needed to run them, so they are checked as far as one can be without it:
    # every flag parses, every kustomization and make target exists.
    commands = other_commands()
    assert any(c.startswith("kubectl apply -k") for c in commands), commands
    makefile = (REPO / "Makefile").read_text()
    for command in commands:
        words = shlex.split(command)
        if command == ". .venv/bin/activate":
            continue
        if words[:2] == ["python", "-m"]:
            module = words[2]
            assert importlib.util.find_spec(module), f"{command}: no module {module}"
            parser_module = importlib.import_module(PARSERS.get(module, module))
            if hasattr(parser_module, "build_parser"):
                parser_module.build_parser().parse_args(words[3:])  # exits on a bad flag
        elif words[:3] == ["kubectl", "apply", "-k"]:
            assert (REPO / words[3] / "kustomization.yaml").is_file(), command
        elif words[0] == "make":
            assert re.search(rf"^{re.escape(words[1])}:", makefile, flags=re.M), command
        else:
            pytest.fail(f"README command {command!r}: this test has no check for it")


def test_every_block_that_runs_python_activates_the_environment_first() -> None:
    # The trap: after `make run`, a bare `python -m training.fit` fails with "No
    # module named 'pandas'". Every block with a python command must work when pasted alone.
    blocks = readme_commands()
    assert any(any("python -m training." in c for c in block) for block in blocks)
    for block in blocks:
        first_python = next((i for i, c in enumerate(block) if c.startswith("python")), None)
        if first_python is None:
            continue
        assert ". .venv/bin/activate" in block[:first_python], (
            f"a README block runs {block[first_python]!r} without activating .venv first"
        )


def to_script(blocks: list[list[str]], prometheus_url: str, port: int) -> str:
    """The README's commands as one bash script, with the test's changes (module docstring)."""
    lines = [
        "set -euo pipefail",
        "SERVER=''",
        "stop_server() {",
        '  if [ -n "$SERVER" ]; then kill -- "-$SERVER" 2>/dev/null || true;',
        '    wait "$SERVER" 2>/dev/null || true; SERVER=""; fi',
        "}",
        "trap stop_server EXIT",
        "start_server() {  # $1: log file; the rest: the command, in its own process group",
        '  local log=$1; shift; stop_server; setsid "$@" >"$log" 2>&1 </dev/null & SERVER=$!',
        "  for _ in $(seq 1200); do",
        '    grep -q listening "$log" && return 0',
        '    kill -0 "$SERVER" 2>/dev/null || { cat "$log" >&2; return 1; }',
        "    sleep 0.1",
        "  done",
        '  cat "$log" >&2; return 1',
        "}",
    ]
    servers = 0
    for block in blocks:
        for command in block:
            if command.startswith(SKIPPED):
                continue
            command = command.replace(README_PORT, f"127.0.0.1:{port}")
            command = PROMETHEUS_ASSIGNMENT.sub(
                f"PROMETHEUS={shlex.quote(prometheus_url)}", command
            )
            lines.append(f"echo '+ '{shlex.quote(command)} >&2")
            if SERVER.match(command):
                servers += 1
                lines.append(f"start_server server-{servers}.log bash -c {shlex.quote(command)}")
            else:
                lines.append(command)
                lines.append("echo")  # the answers of curl end without a newline
    return "\n".join(lines) + "\n"


# ---- a fresh copy and a Prometheus with a week of data --------------------------------------


def fresh_copy(destination: Path) -> Path:
    """The repository as a clone has it (tracked and new unignored files), with `.venv`
    linked to the project's installed environment."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)  # mtimes kept: make sees .venv up to date
    (destination / ".venv").symlink_to(Path(sys.prefix))
    return destination


def clean_environment(port: int, tmp_path: Path) -> dict[str, str]:
    """A shell's environment without any virtual environment, as a new user's would be."""
    venvs = {str(Path(sys.prefix) / "bin"), str(REPO / ".venv" / "bin")}
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in venvs]
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not key.startswith("PAS_")
    }
    return {
        **environment,
        "PATH": os.pathsep.join(path),
        "PAS_PORT": str(port),
        "TMPDIR": str(tmp_path),
    }


def week_of_exporter_data(work: Path) -> None:
    """A synthetic fleet's last FLEET_HOURS of exporter series, ending a minute ago, in a
    Prometheus data directory (`start_prometheus(work)` serves it)."""
    fleet = synth_fleet(FLEET_NODES, FLEET_HOURS, STEP_S, seed=11)
    now = pd.Timestamp(datetime.now(UTC)).floor("min")
    fleet["timestamp"] += (now - pd.Timedelta(minutes=1)) - fleet["timestamp"].max()
    table = work / "fleet.parquet"
    write_metrics(fleet, table)
    source = work / "exporters.om"
    write_exporter_openmetrics([table], source, STEP_S)
    # Blocks as long as the data (promtool's default, 2 h, makes 84 blocks and takes 15x longer).
    backfill(
        source,
        work / "prometheus" / "data",
        extra_args=[f"--max-block-duration={FLEET_HOURS + 72}h"],
    )


@pytest.mark.slow
@pytest.mark.prometheus
def test_the_readme_commands_run_as_written_in_a_fresh_copy(tmp_path: Path) -> None:
    require_prometheus()
    for tool in ("make", "curl", "git", "setsid"):
        if shutil.which(tool) is None:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"CI=true but {tool} is missing (the README's commands use it)")
            pytest.skip(f"needs {tool}")
    stamp = Path(sys.prefix) / ".installed"
    if stamp.exists() and stamp.stat().st_mtime < (REPO / "pyproject.toml").stat().st_mtime:
        pytest.skip("the environment is older than pyproject.toml: run `make test`")
    clone = fresh_copy(tmp_path / "clone")
    prometheus_dir = tmp_path / "prometheus-data"
    prometheus_dir.mkdir()
    week_of_exporter_data(prometheus_dir)
    port = free_port()
    with start_prometheus(prometheus_dir) as prometheus:
        script = to_script(readme_commands(), prometheus.url, port)
        (tmp_path / "readme.sh").write_text(script)
        done = subprocess.run(
            ["bash", str(tmp_path / "readme.sh")],
            cwd=clone,
            env=clean_environment(port, tmp_path),
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT_S,
        )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-6000:]}"
    answers = [line for line in done.stdout.splitlines() if line.startswith(("[", "{"))]
    # The Quick start's prioritize, on the demo cluster.
    assert answers[0].startswith('[{"Host":"node-01","Score":'), answers
    # The local try-out's explain, on the synthetic fleet's own bundle.
    assert answers[-1].startswith('{"pod":"default/demo"'), answers[-1][:200]
    assert '"node":"node-01"' in answers[-1] and '"model":"own"' in answers[-1]
    for written in ("metrics.parquet", "bundle/manifest.json", "fleet.parquet", "cluster.json"):
        assert (clone / written).is_file(), f"the README's commands did not write {written}"
