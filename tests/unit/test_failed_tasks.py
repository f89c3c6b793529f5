"""scripts/failed-tasks.awk: the summary `make molecule` prints when a scenario fails."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "failed-tasks.awk"
LOG = ROOT / "tests" / "fixtures" / "ansible_failed_run.log"

pytestmark = pytest.mark.skipif(shutil.which("awk") is None, reason="awk is not installed")


def summarise(text: str) -> str:
    return subprocess.run(["awk", "-f", str(SCRIPT)], input=text, capture_output=True, text=True, check=True).stdout


def test_prints_each_failed_task_with_its_result_and_leaves_out_ignored_ones():
    out = summarise(LOG.read_text())
    assert "TASK [Check it]" in out
    assert '"msg": "L2: repeat {\'a\': 1}"' in out
    assert "TASK [Check the L3 hit]" in out and "fatal: [spark02]" in out
    assert "msg: 'L3: repeat" in out
    # The ignored failure, the retries and the tasks that passed are not failures.
    assert "TASK [Ignored]" not in out and "/bin/false" not in out
    assert "RETRYING" not in out and "ok: [spark02]" not in out
    assert out.count("fatal: [") == 2


def test_says_so_when_no_task_failed():
    out = summarise("PLAY [x] ***\nTASK [y] ***\nok: [h]\n")
    assert "no failed task" in out
