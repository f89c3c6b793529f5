"""The kv_store_health module's probe logic against a real server (redis-server from apt, started per test module)."""

import kv_store_health as mod
import pytest


def params(port, **kw):
    base = dict(
        host="127.0.0.1",
        port=port,
        username="probe",
        password="probe-password-1234567",
        expect_auth_required=False,
        expect_config={},
        roundtrip=False,
        timeout=5.0,
    )
    base.update(kw)
    return base


def test_healthy_server_reports_identity_and_memory(redis_server):
    result, failures = mod.probe(
        params(redis_server, expect_auth_required=True, roundtrip=True, expect_config={"save": "", "appendonly": "no"}),
        check_mode=False,
    )
    assert failures == []
    assert result["flavor"] in ("redis", "valkey")
    assert result["roundtrip"] == "ok"
    assert result["config"] == {"appendonly": "no", "save": ""}
    assert result["persistence"]["aof_enabled"] is False


def test_wrong_password_is_a_failure_naming_the_user(redis_server):
    _, failures = mod.probe(params(redis_server, password="nope"), check_mode=False)
    assert len(failures) == 1
    assert "authentication as 'probe'" in failures[0]
    assert "WRONGPASS" in failures[0]


def test_config_mismatch_says_what_and_where(redis_server):
    _, failures = mod.probe(params(redis_server, expect_config={"maxmemory-policy": "allkeys-lru"}), check_mode=False)
    assert failures == [f"config maxmemory-policy is 'noeviction' on 127.0.0.1:{redis_server}, expected 'allkeys-lru'"]


def test_protected_server_passes_the_auth_required_check(redis_server):
    # The fixture's server disables the default user, so an unauthenticated PING is refused with NOAUTH.
    assert mod.check_auth_required(params(redis_server)) is None


def test_roundtrip_is_skipped_in_check_mode(redis_server):
    result, failures = mod.probe(params(redis_server, roundtrip=True), check_mode=True)
    assert failures == []
    assert result["roundtrip"] == "skipped (check mode)"


def test_unreachable_endpoint_raises_oserror():
    with pytest.raises(OSError):
        mod.probe(params(1, timeout=1.0), check_mode=False)
