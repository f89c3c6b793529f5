"""The command line's contract: exit statuses, Ansible's inventory when -i is not given, a closed pipe."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from kvtier import cli, exits

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOOD = ROOT / "tests" / "fixtures" / "inventories" / "good"


@pytest.mark.parametrize(
    "argv",
    [
        ["prove", "--tier", "l3", "-i", str(GOOD)],
        ["bench", "ttft", "--sweep", "tiers", "-i", str(GOOD)],
    ],
)
def test_a_disturbing_action_without_consent_is_refused_with_3(argv, capsys):
    assert cli.main(argv) == exits.REFUSED
    assert "refused" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["health"], ["prove"], ["warmup", "--lengths", "512"], ["bench", "ttft"]])
def test_an_inventory_that_does_not_exist_is_bad_input(command, tmp_path, capsys):
    assert cli.main([*command, "-i", str(tmp_path / "nowhere")]) == exits.BAD_INPUT
    assert "does not exist" in capsys.readouterr().err


def test_bad_usage_is_2():
    with pytest.raises(SystemExit) as exited:
        cli.main(["health", "--no-such-flag"])
    assert exited.value.code == exits.BAD_INPUT


def _default_inventory(tmp_path, **env) -> subprocess.CompletedProcess:
    """exits.inventory(None) in a fresh interpreter (Ansible reads its configuration once, at import)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return subprocess.run(
        [sys.executable, "-c", "from kvtier import exits; print(exits.inventory(None))"],
        cwd=tmp_path,
        env={**clean, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
    )


def test_without_i_the_inventory_is_ansibles(tmp_path):
    (tmp_path / "hosts").mkdir()
    (tmp_path / "other.yml").write_text("all: {}\n")
    (tmp_path / "ansible.cfg").write_text("[defaults]\ninventory = ./hosts\n")
    assert _default_inventory(tmp_path).stdout.strip() == str(tmp_path / "hosts")
    chosen = _default_inventory(tmp_path, ANSIBLE_INVENTORY=str(tmp_path / "other.yml"))
    assert chosen.stdout.strip() == str(tmp_path / "other.yml")
    (tmp_path / "ansible.cfg").write_text("[defaults]\ninventory = ./missing\n")
    refused = _default_inventory(tmp_path)
    assert refused.returncode != 0 and "no inventory: pass -i" in refused.stderr


def test_a_closed_pipe_ends_quietly(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtier.cli", "plan", "--model", "Qwen3-8B"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader goes away before the first line
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert proc.returncode == cli.CLOSED_PIPE
