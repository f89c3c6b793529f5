"""Filters of the kv_store role (controller side).

    problems: "{{ password | kv_store_password_problems('kv_store_admin_password') }}"   # [] when acceptable

The password policy is kvtier's one policy (kvtier.passwords), shared with preflight and the vllm_lmcache role;
a problem names the variable, never the value.
"""

from __future__ import annotations

import pathlib
import sys

try:
    from kvtier import passwords
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
    from kvtier import passwords


def kv_store_password_problems(value, name):
    return passwords.problems(value, str(name))


def kv_store_lmcache_logins(secret, user, clients):
    """[{name, password}]: each Spark's own L2 login (a secret: keep it out of logs)."""
    logins = (passwords.node_login(str(user), str(client), str(secret)) for client in clients or [])
    return [{"name": name, "password": password} for name, password in logins]


def kv_store_login_password(secret, user):
    """The password of the ACL user `user`, derived from `secret` (a secret: keep it out of logs)."""
    return passwords.login_password(str(secret), str(user))


class FilterModule:
    def filters(self):
        return {
            "kv_store_password_problems": kv_store_password_problems,
            "kv_store_lmcache_logins": kv_store_lmcache_logins,
            "kv_store_login_password": kv_store_login_password,
        }
