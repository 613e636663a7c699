"""The console scripts pyproject.toml declares, as installed into this environment."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from funnel.scripts import cli
from tests.conftest import ROOT

BIN = Path(sys.executable).parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_funnel_command_answers_help(command):
    done = run(str(BIN / "funnel"), command, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


@pytest.mark.parametrize("script", ["funnel-web", "funnel-worker", "funnel-client"])
def test_tier_scripts_answer_help(script):
    done = run(str(BIN / script), "--help")
    assert done.returncode == 0, done.stderr
    assert "FUNNEL_" in done.stdout or "usage:" in done.stdout


def test_unknown_command_is_refused_with_the_list():
    done = run(str(BIN / "funnel"), "serve")
    assert done.returncode == 2
    assert "unknown command 'serve'" in done.stderr and "inspect" in done.stderr


def test_nothing_edits_sys_path():
    """Imports come from the installed package; no module may reach around it."""
    offenders = []
    for folder in ("common", "web", "worker", "scripts", "client", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == Path(__file__):  # this test names what it looks for
                continue
            text = path.read_text()
            if "sys.path.insert" in text or "sys.path.append" in text or "sys.path[0] =" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_which_finds_the_installed_scripts():
    assert shutil.which("funnel", path=str(BIN)) and shutil.which("funnel-web", path=str(BIN))
