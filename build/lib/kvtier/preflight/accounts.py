"""Checks of the accounts: the service user that runs vLLM and LMCache is never the account Ansible logs in as.

The vllm_lmcache role makes its service user a system account with no shell and its home under /var/lib: were
it the login user, the run would change the operator's own account (at best usermod refuses a user with running
processes, at worst every Spark locks the operator out). Check mode shows that task only as "changed".
"""

from __future__ import annotations

from collections.abc import Mapping

SERVICE_USER_VAR = "vllm_lmcache_user"


def login_user_problems(login_users: Mapping, service_users: Mapping) -> list:
    """Problems for every host whose login user (ansible_user, or who runs Ansible when unset) is its service user.

    `login_users`: host -> (user, where it comes from); `service_users`: host -> the service user's name.
    """
    problems = []
    for host, (user, source) in login_users.items():
        service = service_users.get(host)
        if service == "root":
            problems.append(f"host {host}: {SERVICE_USER_VAR} must not be root: the services run unprivileged")
        elif user and service and user == service:
            problems.append(
                f"host {host}: Ansible logs in as {user!r} ({source}) and {SERVICE_USER_VAR} is {service!r}: the "
                f"role would turn that login into a system account without a shell. Log in as another user, or "
                f"set {SERVICE_USER_VAR} to a name no one logs in with (default kvtier-svc)"
            )
    return problems
