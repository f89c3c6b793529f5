"""The LMCache server's start gate (roles/vllm_lmcache/files/kvtier_l2_login_check.py), installed as the role
installs it (beside module_utils/kvtier_resp.py) and run against a real redis-server with an ACL user."""

import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "vllm_lmcache" / "files" / "kvtier_l2_login_check.py"


def _gate(tmp_path, port, password, user="probe"):
    for source in (SCRIPT, REPO / "module_utils" / "kvtier_resp.py"):
        shutil.copy(source, tmp_path / source.name)
    env = {"PATH": os.environ["PATH"], "LMCACHE_RESP_USERNAME": user, "LMCACHE_RESP_PASSWORD": password}
    return subprocess.run(
        [sys.executable, str(tmp_path / SCRIPT.name), "127.0.0.1", str(port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_refused_login_stops_the_start_and_says_why(tmp_path, redis_server):
    refused = _gate(tmp_path, redis_server, "an-old-password-000000")
    assert refused.returncode == 1
    assert "refuses LMCache's login as 'probe'" in refused.stderr and "spark.yml" in refused.stderr
    assert "an-old-password" not in refused.stderr + refused.stdout


def test_the_right_login_or_a_server_that_is_down_lets_it_start(tmp_path, redis_server):
    assert _gate(tmp_path, redis_server, "probe-password-1234567").returncode == 0
    down = _gate(tmp_path, 9, "probe-password-1234567")
    assert down.returncode == 0 and "does not answer" in down.stderr


def test_a_user_allowed_only_its_keys_passes(tmp_path, redis_server):
    """The gate only logs in: a store user without PING or INFO (LMCache needs neither) is not refused."""
    gated = _gate(tmp_path, redis_server, "keys-only-password-12345", user="keys-only")
    assert gated.returncode == 0, gated.stderr
