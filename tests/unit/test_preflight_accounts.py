from kvtier.preflight import accounts


def test_distinct_users_pass():
    assert accounts.login_user_problems({"s1": ("kvtier", "ansible_user")}, {"s1": "kvtier-svc"}) == []


def test_the_controllers_user_counts_when_ansible_user_is_unset():
    found = accounts.login_user_problems({"s1": ("kvtier-svc", "the controller's user")}, {"s1": "kvtier-svc"})
    assert len(found) == 1 and "host s1: Ansible logs in as 'kvtier-svc' (the controller's user)" in found[0]


def test_root_as_service_user_is_refused():
    found = accounts.login_user_problems({"s1": ("kvtier", "ansible_user")}, {"s1": "root"})
    assert found == ["host s1: vllm_lmcache_user must not be root: the services run unprivileged"]
