"""playbooks/preflight.yml against fixture inventories: each bad inventory fails with its exact message.

Every negative case is tests/fixtures/inventories/good/ with one case directory layered on top (a later
inventory source wins), so each fixture holds only what is wrong. The inventory checks run on the
controller (connection local, no facts); only the hardware test gathers facts of this machine.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

from ._playbook import results, run_json

ROOT = pathlib.Path(__file__).resolve().parents[2]
INVENTORIES = ROOT / "tests" / "fixtures" / "inventories"
GOOD = INVENTORIES / "good"


def run_preflight(tmp_path, *inventories, extra=(), hardware=False):
    """(return code, the messages of every failed task) of one ansible-playbook run."""
    args = ["playbooks/preflight.yml"]
    for inventory in inventories:
        args += ["-i", inventory]
    if not hardware:
        args += ["--skip-tags", "preflight_hardware"]
    rc, report = run_json(tmp_path, *args, *extra)
    messages = []
    for result in results(report):
        if result.get("failed"):
            messages.extend(str(result.get("msg", "")).split("\n- ")[1:] or [str(result.get("msg"))])
    return rc, messages


def layered(tmp_path, case, **kwargs):
    return run_preflight(tmp_path, GOOD, INVENTORIES / case, **kwargs)


def test_good_inventory_passes(tmp_path):
    assert run_preflight(tmp_path, GOOD) == (0, [])


def test_example_inventory_only_lacks_real_secrets(tmp_path):
    """inventory/example is complete: the vault placeholders are the only thing an operator must replace."""
    rc, messages = run_preflight(tmp_path, ROOT / "inventory" / "example")
    assert rc != 0
    assert [m.split(":")[0] for m in messages] == [
        "kv_store_lmcache_password still has an example value",
        "kv_store_admin_password still has an example value",
        "vllm_lmcache_api_key still has an example value",
    ]


def test_controller_versions_collections_and_libraries(tmp_path):
    rc, messages = run_preflight(
        tmp_path,
        GOOD,
        extra=[
            "-e",
            "preflight_ansible_min=2.99",
            "-e",
            "preflight_ansible_max=3.0",
            "-e",
            f"preflight_requirements_file={ROOT / 'tests/fixtures/preflight_requirements.yml'}",
            "-e",
            '{"preflight_python_libraries": ["kvtier_no_such_library"]}',
        ],
    )
    import ansible.release
    import ansible_collections.ansible.utils  # noqa: F401  (installed with the `ansible` bundle)

    installed = json.loads((pathlib.Path(ansible_collections.ansible.utils.__path__[0]) / "MANIFEST.json").read_text())[
        "collection_info"
    ]["version"]
    assert rc != 0
    assert messages == [
        f"ansible-core {ansible.release.__version__} is not supported: kvtier needs >= 2.99 and < 3.0 "
        "(preflight_ansible_min, preflight_ansible_max); install the pinned set with `pip install -r "
        "requirements.lock`",
        f"collection ansible.utils {installed} is older than 99.0.0 (requirements.yml): "
        f"run `ansible-galaxy collection install -r requirements.yml --upgrade`",
        "collection kvtier_test.absent is not installed (requirements.yml pins 1.0.0): "
        "run `ansible-galaxy collection install -r requirements.yml`",
        f"Python library kvtier_no_such_library is not importable by the controller's Python ({sys.executable}), "
        f"which runs ansible-playbook: install it there (`{sys.executable} -m pip install kvtier_no_such_library`) "
        f"or install the pinned set with `pip install -r requirements.lock`",
    ]


def test_no_storage_node_and_no_sparks(tmp_path):
    rc, messages = run_preflight(tmp_path, INVENTORIES / "groups_empty")
    assert rc != 0
    assert messages == [
        "group storage must have exactly one host (the storage node); it has none: put the one storage node under "
        "all.children.storage.hosts",
        "group spark must have at least 1 host(s) (the DGX Spark serving nodes); it has none: put them under "
        "all.children.spark.hosts",
    ]


def test_two_storage_nodes(tmp_path):
    rc, messages = layered(tmp_path, "two_storage")
    assert rc != 0
    assert messages == [
        "group storage must have exactly one host (the storage node); it has 2 (kv-storage01, "
        "kv-storage02): put the one storage node under all.children.storage.hosts"
    ]


def test_address_outside_the_data_network(tmp_path):
    rc, messages = layered(tmp_path, "address_outside_cidr")
    assert rc != 0
    assert messages == [
        "host spark02: kvtier_data_address 10.20.0.22 is outside the data network 10.10.0.0/24 (roce_address of "
        "kv-storage01): use an address on the RoCE network",
        "host spark02: roce_address 10.20.0.22/24 is outside the data network 10.10.0.0/24 (roce_address of "
        "kv-storage01): use an address on the RoCE network",
    ]


def test_duplicate_data_address(tmp_path):
    rc, messages = layered(tmp_path, "duplicate_address")
    assert rc != 0
    # The cluster spec also reports the ports the two nodes would share on that address.
    assert messages[0] == (
        "address 10.10.0.21 is used by more than one host: spark01 (kvtier_data_address), "
        "spark02 (kvtier_data_address): give each node its own address"
    )


def test_mtu_mismatch(tmp_path):
    rc, messages = layered(tmp_path, "mtu_mismatch")
    assert rc != 0
    assert messages == [
        "roce_mtu differs between nodes (1500 on spark01; 9000 on kv-storage01, spark02, spark03, "
        "spark04): the RDMA path MTU follows the smallest and mismatched MTUs drop large frames; set "
        "one roce_mtu for all nodes (group_vars/all)"
    ]


def test_invalid_cluster_spec(tmp_path):
    rc, messages = layered(tmp_path, "tier_spec")
    assert rc != 0
    assert messages == [
        "kvtier_cluster: lmcache.chunk_size 100 is not a multiple of vllm.block_size 16: the LMCache "
        "connector refuses to start; set lmcache.chunk_size to a multiple of 16 (e.g. 96 or 112)"
    ]


def test_tiers_disagree_with_the_storage_node(tmp_path):
    rc, messages = layered(tmp_path, "tier_storage_mismatch")
    assert rc != 0
    assert messages[:3] == [
        "kvtier_cluster.l2.host is 10.10.0.99, but the storage node kv-storage01 has kvtier_data_address 10.10.0.10: "
        "LMCache would never reach its L2 tier; make them equal",
        "kvtier_cluster.l2.user is cache, but the storage node kv-storage01 has kv_store_lmcache_user lmcache: "
        "LMCache would never reach its L2 tier; make them equal",
        "host spark01: kvtier_cluster.l3.path /var/lib/lmcache is not under its NFS mount nfs_client_mount_point "
        "/mnt/kvcache: the L3 tier would be a local directory, not the shared NVMe pool; put l3.path below the "
        "mount point",
    ]
    assert len(messages) == 6  # l3.path once per Spark


def test_example_credentials(tmp_path):
    rc, messages = layered(tmp_path, "credentials_example")
    assert rc != 0
    assert messages == [
        "kv_store_lmcache_password still has an example value: replace it with a generated one (openssl rand "
        "-base64 32) in a vault (hosts: kv-storage01, spark01, spark02, spark03, spark04)",
        "kv_store_admin_password still has an example value: replace it with a generated one (openssl rand -base64 "
        "32) in a vault (hosts: kv-storage01)",
    ]


def test_missing_and_short_credentials_never_show_values(tmp_path):
    rc, messages = layered(tmp_path, "credentials_missing")
    assert rc != 0
    assert messages == [
        "kv_store_lmcache_password is not set: define it in a vault (see inventory/example/group_vars/all/vault.yml) "
        "(hosts: kv-storage01, spark01, spark02, spark03, spark04)",
        "kv_store_admin_password is shorter than 16 characters: use a generated one (openssl rand -base64 32) "
        "(hosts: kv-storage01)",
    ]
    assert not any("short-one" in m for m in messages)


def test_misspelt_removed_and_internal_variables(tmp_path):
    rc, messages = layered(tmp_path, "misspelt_variables")
    assert rc != 0
    assert messages == [
        "kv_store_flavors (set for kv-storage01) is internal to role kv_store (roles/kv_store/vars/main.yml) and "
        "overrides nothing from the inventory: remove it",
        "nvme_raid_members (set for kv-storage01) was removed: list the members by serial in nvme_raid_serials",
        "roce_mtus (set for spark01) is not a variable of any kvtier role (did you mean roce_mtu?): rename or "
        "remove it",
    ]


def test_hardware_of_this_machine_does_not_match(tmp_path):
    """The fixture's hosts are this machine (connection local): no RoCE NIC, no 3 TB of memory, no 8 Solidigm drives."""
    rc, messages = layered(tmp_path, "hardware", hardware=True, extra=["--limit", "kv-storage01,spark01"])
    assert rc != 0
    assert any(
        m.startswith(
            "host spark01: memory budget model.weights_gib 16.4 + vllm.gpu_kv_cache_gib 40 + "
            "lmcache.l0_dram_gib 3000 + memory.runtime_overhead_gib 4 + memory.os_reserve_gib 8 = "
            "3068.4 GiB is more than the "
        )
        for m in messages
    ), messages
    # Nor 3 TB of it free: the free-memory check reads this machine's available memory the same way.
    assert any(m.startswith("host spark01: the services need model.weights_gib 16.4 + ") for m in messages), messages
    assert any(
        m.startswith("host spark01: roce_interface enp1s0f0np0 is not a network interface of the host (found: ")
        for m in messages
    ), messages
    nvme_problems = [m for m in messages if m.startswith("host kv-storage01: ") and "NVMe drive" in m]
    if shutil.which("nvme"):
        assert nvme_problems, messages
    else:  # a fresh node without nvme-cli: reported as not checked yet (nvme_raid checks again), not a failure
        assert nvme_problems == [], messages


def test_site_yml_stops_before_the_storage_play(tmp_path):
    """site.yml runs preflight first: a bad inventory never reaches a play that touches a host."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path))
    proc = subprocess.run(
        [
            str(pathlib.Path(sys.executable).parent / "ansible-playbook"),
            "playbooks/site.yml",
            "-i",
            str(GOOD),
            "-i",
            str(INVENTORIES / "tier_spec"),
            "--skip-tags",
            "preflight_hardware",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "kvtier preflight found" in proc.stdout + proc.stderr
    assert "Storage node - NVMe RAID0" not in proc.stdout


def test_login_user_is_the_service_user(tmp_path):
    """The role would make the login account a shell-less system user: refused before anything changes,
    in check mode too (where the user task would only show "changed")."""
    for extra in ((), ("--check",)):
        rc, messages = layered(tmp_path, "login_is_service_user", extra=extra)
        assert rc != 0
        assert messages == [
            f"host {host}: Ansible logs in as {user!r} (ansible_user) and vllm_lmcache_user is {user!r}: the role "
            "would turn that login into a system account without a shell. Log in as another user, or set "
            "vllm_lmcache_user to a name no one logs in with (default kvtier-svc)"
            for host, user in (("spark01", "kvtier-svc"), ("spark02", "ops"))
        ]
