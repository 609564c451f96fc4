"""scripts/gpu-check.sh runs where nobody can fix it as it goes: on a lent GPU, its minutes
counted. Every localspec command in it must still parse, and every flag it hands a script must
still be one that script takes (`REHEARSE=1 bash scripts/gpu-check.sh` runs the whole of it on
this CPU, in about five minutes)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from localspec import cli

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
# What the script's loops and variables stand for, one value each.
STAND_INS = {"$O": "/tmp/out", "$1": "len=4", "$2": "auto", "$rb": "8", "$v": "--shapes 1,16", "$m": "moe"}


def logical_lines() -> list[str]:
    return SCRIPT.read_text().replace("\\\n", " ").splitlines()


def command(line: str, marker: str) -> str:
    """The command that starts at `marker`, without what its output goes into."""
    return re.split(r"\s(?:\d?>|\|)", line[line.index(marker):])[0]


def localspec_commands() -> list[list[str]]:
    lines = logical_lines()
    defined = {m.group(1): m.group(2) for line in lines if (m := re.match(r'\s*([A-Z])="([^"]*)"', line))}
    commands = []
    for line in lines:
        if "$L " not in line:
            continue
        text = command(line, "$L ")[len("$L "):]
        for name, value in {**{f"${k}": v for k, v in defined.items()}, **STAND_INS}.items():
            text = text.replace(name, value)
        commands.append(shlex.split(text))
    return commands


@pytest.mark.unit
def test_every_localspec_command_of_the_gpu_check_parses():
    commands = localspec_commands()
    assert len(commands) >= 8 and {c[0] for c in commands} == {"generate", "bench"}
    for args in commands:
        try:
            cli.parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"gpu-check.sh: `localspec {shlex.join(args)}` no longer parses")


@pytest.mark.unit
def test_every_script_the_gpu_check_runs_takes_its_flags():
    checked = 0
    for line in logical_lines():
        m = re.search(r"\$V/python ((?:scripts|tests)/\S+\.py)", line)
        if not m:
            continue
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", command(line, m.group(1))))
        usage = subprocess.run([sys.executable, str(ROOT / m.group(1)), "--help"], capture_output=True,
                               text=True, cwd=ROOT).stdout
        assert not flags - set(re.findall(r"--[a-z][a-z0-9-]*", usage)), f"gpu-check.sh: {m.group(1)}"
        checked += 1
    assert checked >= 5
