"""Verify kv_store from outside the service: a client on the controller talking to the container's address."""

import ipaddress
import os
import time

import pytest
import redis
import testinfra.utils.ansible_runner

from kvtier import passwords

INVENTORY = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"])


def _backend(name):
    # testinfra drives a host on Ansible's podman connection through a whole Ansible run per command (~7 s
    # each, 2 minutes for this file); `podman exec`, which that connection runs anyway, takes a fraction of a second.
    connection = INVENTORY.get_variables(name).get("ansible_connection", "")
    return f"podman://{name}" if connection.endswith("podman") else name


testinfra_hosts = [_backend(name) for name in INVENTORY.get_hosts("all")]

FLAVORS = {
    "redis": {
        "package": "redis-server",
        "service": "redis-server",
        "conf": "/etc/redis/redis.conf",
        "acl": "/etc/redis/users.acl",
        "data": "/var/lib/redis",
    },
    "valkey": {
        "package": "valkey-server",
        "service": "valkey-server",
        "conf": "/etc/valkey/valkey.conf",
        "acl": "/etc/valkey/users.acl",
        "data": "/var/lib/valkey",
    },
}


@pytest.fixture(scope="module")
def hostvars(host):
    return INVENTORY.get_variables(host.backend.get_hostname())


@pytest.fixture(scope="module")
def flavor(hostvars):
    return FLAVORS[hostvars["kv_store_expected_flavor"]]


@pytest.fixture(scope="module")
def address(host):
    """The IPv4 address of the interface that holds the default route (the one clients on the network use)."""
    found = [a for a in host.interface.default().addresses if ipaddress.ip_address(a).version == 4]
    assert found, "the host has no IPv4 address on its default route's interface"
    return found[0]


def lmcache_login(hostvars, secret=None) -> tuple:
    """The first Spark's own L2 login, as kv_store derives it from the cluster's L2 secret."""
    user = hostvars.get("kv_store_lmcache_user", "lmcache")
    return passwords.node_login(
        user, hostvars["kv_store_lmcache_clients"][0], secret or hostvars["kv_store_lmcache_password"]
    )


def client(address, hostvars, who=None, **kw):
    creds = {}
    if who == "lmcache":
        username, password = lmcache_login(hostvars)
        creds = {"username": username, "password": password}
    elif who == "admin":
        creds = {
            "username": hostvars.get("kv_store_admin_user", "kvtier-admin"),
            "password": hostvars["kv_store_admin_password"],
        }
    return redis.Redis(host=address, port=6379, socket_timeout=10, **creds, **kw)


def test_expected_server_is_installed_and_running(host, hostvars, flavor, address):
    assert host.package(flavor["package"]).is_installed
    assert host.service(flavor["service"]).is_running
    assert host.service(flavor["service"]).is_enabled
    info = client(address, hostvars, "admin").info("server")
    assert ("valkey_version" in info) == (hostvars["kv_store_expected_flavor"] == "valkey")


def test_unauthenticated_clients_are_refused(hostvars, address):
    anonymous = client(address, hostvars)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.set("kvtier:test:anonymous", "x")
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.get("kvtier:test:anonymous")


def test_default_user_is_disabled(hostvars, address):
    # Even the right password does not open the built-in user.
    with pytest.raises(redis.exceptions.AuthenticationError):
        client(address, hostvars, username="default", password=hostvars["kv_store_admin_password"]).ping()


def test_each_spark_logs_in_as_itself_and_no_login_is_shared(hostvars, address):
    user, secret = hostvars.get("kv_store_lmcache_user", "lmcache"), hostvars["kv_store_lmcache_password"]
    first, second = (passwords.node_login(user, spark, secret) for spark in hostvars["kv_store_lmcache_clients"][:2])
    assert first[1] != second[1]
    for name, password in (first, second):
        assert client(address, hostvars, username=name, password=password).ping()
    refused = [
        (user, secret),  # no user shared by every Spark
        (first[0], second[1]),  # one Spark's password is not another's
        passwords.node_login(user, "spark-not-in-the-inventory", secret),  # a Spark removed from the clients
    ]
    for name, password in refused:
        with pytest.raises(redis.exceptions.AuthenticationError):
            client(address, hostvars, username=name, password=password).ping()


def test_wrong_password_is_refused(hostvars, address):
    with pytest.raises(redis.exceptions.AuthenticationError):
        client(address, hostvars, username=lmcache_login(hostvars)[0], password="not-the-password-000").ping()


def test_lmcache_user_can_store_and_load(hostvars, address):
    lmcache = client(address, hostvars, "lmcache")
    payload = os.urandom(256 * 1024)
    assert lmcache.set("kvtier:test:chunk", payload)
    assert lmcache.exists("kvtier:test:chunk") == 1
    assert lmcache.get("kvtier:test:chunk") == payload
    assert lmcache.delete("kvtier:test:chunk") == 1


def test_lmcache_user_has_least_privilege(hostvars, address):
    lmcache = client(address, hostvars, "lmcache")
    for command in (("FLUSHALL",), ("CONFIG", "GET", "maxmemory"), ("KEYS", "*"), ("ACL", "LIST")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            lmcache.execute_command(*command)


def test_cache_settings_are_in_force(hostvars, address):
    config = client(address, hostvars, "admin").config_get("*")
    assert config["save"] == ""
    assert config["appendonly"] == "no"
    assert config["maxmemory-policy"] == "allkeys-lru"
    assert config["protected-mode"] == "yes"
    assert int(config["maxmemory"]) > 0


def test_filling_past_maxmemory_evicts_instead_of_failing(hostvars, address):
    admin = client(address, hostvars, "admin")
    lmcache = client(address, hostvars, "lmcache")
    maxmemory = int(admin.config_get("maxmemory")["maxmemory"])
    evicted_before = int(lmcache.info("stats")["evicted_keys"])
    value = os.urandom(64 * 1024)
    keys = 3 * maxmemory // len(value)
    pipe = lmcache.pipeline(transaction=False)
    for i in range(keys):
        pipe.set(f"kvtier:test:fill:{i}", value)
        if i % 64 == 63:
            assert all(pipe.execute()), "a SET failed instead of evicting"
    assert all(pipe.execute())
    stats = lmcache.info("stats")
    memory = lmcache.info("memory")
    assert int(stats["evicted_keys"]) > evicted_before
    assert int(memory["used_memory"]) <= maxmemory * 1.1
    # The last key written survives (eviction runs before each write); which older ones go is not asserted:
    # the server's LRU clock has a 1 s resolution and the whole fill takes about that long, so keys of the
    # same second are equally old to it (key 0 once outlived younger keys here).
    assert lmcache.exists(f"kvtier:test:fill:{keys - 1}") == 1
    survivors = lmcache.exists(*[f"kvtier:test:fill:{i}" for i in range(keys)])
    assert 0 < survivors < keys
    assert survivors * len(value) <= maxmemory * 1.1, f"{survivors} keys of 64 KiB are more than maxmemory allows"


def test_nothing_survives_a_restart(host, hostvars, flavor, address):
    lmcache = client(address, hostvars, "lmcache")
    lmcache.set("kvtier:test:persist", "still here?")
    host.run_expect([0], f"systemctl restart {flavor['service']}")
    deadline = time.monotonic() + 30
    while True:
        try:
            assert client(address, hostvars, "lmcache").get("kvtier:test:persist") is None
            break
        except redis.exceptions.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    leftovers = host.run(f"ls -A {flavor['data']}").stdout.split()
    assert not [f for f in leftovers if f.startswith(("dump", "appendonly"))], leftovers


def test_listens_only_on_configured_addresses(host, address):
    out = host.check_output("ss -ltnH 'sport = :6379'")
    local = {line.split()[3].rsplit(":", 1)[0].strip("[]") for line in out.splitlines()}
    assert local <= {"127.0.0.1", "::1", address}, local
    assert {"127.0.0.1", address} <= local


def test_secrets_are_not_on_disk_in_clear(host, hostvars, flavor):
    acl = host.file(flavor["acl"])
    assert acl.mode == 0o600
    for secret in (
        hostvars["kv_store_lmcache_password"],
        lmcache_login(hostvars)[1],
        hostvars["kv_store_admin_password"],
    ):
        assert secret not in acl.content_string
        assert secret not in host.file(flavor["conf"]).content_string
    assert "user default off" in acl.content_string
    assert not host.file(flavor["conf"]).mode & 0o004  # not world-readable


def test_kernel_settings_are_persisted(host):
    sysctl = host.file("/etc/sysctl.d/60-kvtier-kv-store.conf").content_string
    assert "vm.overcommit_memory=1" in sysctl.replace(" ", "")
    assert "net.core.somaxconn=4096" in sysctl.replace(" ", "")
    assert host.service("kvtier-thp-never.service").is_enabled
