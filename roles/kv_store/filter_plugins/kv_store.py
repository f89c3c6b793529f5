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


class FilterModule:
    def filters(self):
        return {"kv_store_password_problems": kv_store_password_problems}
