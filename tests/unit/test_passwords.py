"""kvtier's one password policy (kvtier.passwords); test_one_definition.py keeps it the only one."""

import pytest

from kvtier import passwords


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


def test_each_node_login_is_its_own_and_passes_the_policy():
    first = passwords.node_login("lmcache", "spark01", "cluster-l2-secret-0123456789")
    second = passwords.node_login("lmcache", "spark02", "cluster-l2-secret-0123456789")
    assert first[0] == "lmcache-spark01" and second[0] == "lmcache-spark02"
    assert first[1] != second[1] and passwords.problem(first[1]) is None
    assert passwords.node_login("lmcache", "spark01", "cluster-l2-secret-0123456789") == first  # stable
    assert passwords.node_login("lmcache", "spark01", "another-l2-secret-0123456789")[1] != first[1]
    assert passwords.login_password("cluster-l2-secret-0123456789", "lmcache-spark01") == first[1]
