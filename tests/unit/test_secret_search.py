"""The lab's search for secret values in the nodes' journals."""

from kvtier import passwords
from kvtier.cluster import tenants
from kvtier.lab import secret_search

VALUES = {
    "kv_store_lmcache_password": "l2-secret-0001",
    "kv_store_admin_password": "admin-secret-0002",
    "router_cache_salt_secret": "salt-secret-0003",
    "tenant_key_lab-a": "",  # an empty value would match every line: it is left out
}


def test_the_search_looks_for_what_the_nodes_hold_derived_from_the_secrets():
    values = secret_search.secret_values(VALUES, ["spark01", "spark02"], "lmcache")
    assert values["L2 password of lmcache-spark02"] == passwords.login_password("l2-secret-0001", "lmcache-spark02")
    # A tenant's salt is an identifier LMCache logs and labels its metrics with, not a credential.
    assert tenants.salt("salt-secret-0003", "lab-b") not in values.values()
    assert "tenant_key_lab-a" not in values and len(values) == 3 + 2


def test_a_secret_on_sudos_command_line_is_found_and_named():
    values = secret_search.secret_values(VALUES, ["spark01"], "lmcache")
    leaked = passwords.login_password("l2-secret-0001", "lmcache-spark01")
    journal = (
        "Started kvtier-lmcache.service.\n"
        "kvtier : PWD=/home/kvtier ; USER=root ; COMMAND=/bin/sh -c 'echo BECOME-SUCCESS-x ; "
        f"REDISCLI_AUTH={leaked} /usr/bin/python3 /tmp/AnsiballZ_command.py'\n"
        "Invoked with argv=['valkey-cli'] stdin=NOT_LOGGING_PARAMETER\n"
    )
    assert [name for name, _ in secret_search.leaks(journal, values)] == ["L2 password of lmcache-spark01"]
