"""kvtier's one password policy (kvtier.passwords), and that it stays the only one."""

import pathlib
import subprocess

import pytest

from kvtier import passwords

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "value, problem",
    [
        (None, "is not set"),
        ("", "is not set"),
        ("changeme", "still has an example value"),
        ("CHANGE_ME", "still has an example value"),  # compared without case, whatever the list's spelling
        ("Change-Me", "still has an example value"),
        ("short-pw-1234", "is shorter than 16 characters"),
        ("sixteen chars ok", "contains whitespace"),
    ],
)
def test_refused(value, problem):
    assert problem in passwords.problem(value)
    assert passwords.problems(value, "kv_store_admin_password")[0].startswith(f"kv_store_admin_password {problem}")


def test_accepted_and_never_echoed():
    assert passwords.problem("a-generated-password-0123") is None
    assert passwords.problems("a-generated-password-0123", "v") == []
    assert not any("Change-Me" in p for p in passwords.problems("Change-Me", "v"))


def test_the_example_list_and_the_length_are_defined_once():
    """Preflight, kv_store, vllm_lmcache and rendering all call kvtier.passwords; no copy of its list may reappear."""
    tracked = subprocess.run(
        ["git", "ls-files", "kvtier", "roles", "playbooks", "library", "inventory"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    copies = []
    for name in tracked:
        text = (ROOT / name).read_text(errors="replace")
        if name != "kvtier/passwords.py" and ("change-me" in text.lower() or "min_length" in text):
            copies.append(name)
    assert copies == []
