"""A golden rendering of inventory/example: every Spark's LMCache server, vLLM and coordinator as the roles render
them (argv and environment; secrets replaced by their names), read through the same inventory code as the CLI.

The fixture is what a reviewer reads against NVIDIA's published DGX Spark settings (docs/real-cluster.md, "A first
run on the hardware"); a change to it is a change to what a real cluster runs. Regenerate it on purpose with
KVTIER_UPDATE_GOLDEN=1 pytest tests/unit/test_golden_example.py, and review the diff.
"""

import json
import os
import pathlib

from kvtier.cluster import cluster_from_hostvars, container, derive, fingerprint, load_order, load_spec, render
from kvtier.inventory import Inventory

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "inventory-example.json"
EXAMPLE_RDMA_DEVICES = ["rocep1s0f0:1", "roceP2p1s0f0:1"]
PASSWORD = "golden-rendering-password-0123"  # the example's vault holds placeholders the policy refuses
API_KEY = "golden-rendering-vllm-key-0123"
# The container route as the role renders it with podman (the serving image's tag is its recipe's digest, made on
# the node; the service user's ids are the node's): the command each unit runs in place of the process itself.
CONTAINER_ROUTE = container.Container(
    "podman", "/usr/bin/podman", "localhost/kvtier-serving:<recipe>", "<uid>:<gid>", "/var/lib/kvtier", gpus=True
)


def _render() -> dict:
    inventory = Inventory(ROOT / "inventory" / "example")
    sparks, storage = inventory.group("spark"), inventory.group("storage")
    names = ("kvtier_cluster", "kvtier_data_address", "roce_address", "nfs_client_server", *derive.FABRIC_VARS)
    hostvars = {host: inventory.hostvars(host, *names) for host in sparks + storage}
    for host in sparks:
        # What the vllm_lmcache role finds behind each Spark's data interfaces (`rdma link`) on the hardware:
        # DGX OS names a ConnectX-7 port's RDMA devices after its PCI functions.
        hostvars[host]["vllm_lmcache_rdma_devices"] = EXAMPLE_RDMA_DEVICES
    storage_vars = inventory.hostvars(storage[0], *derive.STORAGE_VARS)
    spec = load_spec(
        cluster_from_hostvars(hostvars[sparks[0]]["kvtier_cluster"], hostvars, sparks, storage_vars=storage_vars)
    )
    out = {
        "fingerprint": fingerprint(spec),
        "load_order": load_order.decide(spec).describe(),
        "why": render.WHY,
        "hosts": {},
    }
    for host in sparks + storage:
        entry = {
            "roce_address": hostvars[host].get("roce_address"),
            "roce_interface": hostvars[host].get("roce_interface"),
            "roce_extra_interfaces": hostvars[host].get("roce_extra_interfaces"),
        }
        if host in sparks:
            config = render.node_config(spec, host, PASSWORD, API_KEY)
            server = config["lmcache_server"]
            server["secret_env"] = {k: "<secret>" if "PASSWORD" in k else v for k, v in server["secret_env"].items()}
            config["vllm"]["secret_env"] = {k: "<secret>" for k in config["vllm"]["secret_env"]}
            entry.update({k: config[k] for k in ("lmcache_server", "vllm", "endpoints")})
        coordinator = render.coordinator(spec, host)
        entry["coordinator"] = None if coordinator is None else coordinator.to_dict()
        if host in sparks:
            entry["container_route"] = _container_route(spec, entry)
        out["hosts"][host] = entry
    return out


def _container_route(spec, entry) -> dict:
    mounts = {"lmcache": ((spec.l3.path, spec.l3.path, "rw,rslave"),), "vllm": ((spec.model.path,) * 2 + ("ro",),)}
    box = container.Container(**{**CONTAINER_ROUTE.__dict__, "mounts": mounts})
    services = {"lmcache": entry["lmcache_server"], "vllm": entry["vllm"], "coordinator": entry["coordinator"]}
    return {name: container.run_argv(box, name, proc) for name, proc in services.items() if proc is not None}


def test_inventory_example_renders_as_reviewed():
    rendered = _render()
    text = json.dumps(rendered, indent=2, sort_keys=True) + "\n"
    if os.environ.get("KVTIER_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert PASSWORD not in text and API_KEY not in text
    assert json.loads(GOLDEN.read_text()) == rendered, "rendering changed: review it, then KVTIER_UPDATE_GOLDEN=1"


def test_what_the_example_derives():
    rendered = _render()["hosts"]
    spark = rendered["spark02"]
    adapters = [json.loads(a) for a in spark["lmcache_server"]["argv"] if a.startswith("{")]
    # L2 at the storage node's data address and kv_store's port, though the example's spec names neither.
    assert {"type": "resp", "host": "10.10.0.10", "port": 6379, "num_workers": 8} in adapters
    assert spark["lmcache_server"]["secret_env"]["LMCACHE_RESP_USERNAME"] == "lmcache-spark02"  # its own ACL user
    argv = spark["vllm"]["argv"]
    # (119 GiB - 32 LMCache DRAM - 8 OS) / 119: the share vLLM may claim once LMCache holds its DRAM.
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.66"
    assert rendered["kv-storage01"]["roce_address"] == "10.10.0.10/24" and rendered["spark01"]["coordinator"]
    # NIXL on both RoCE devices of the Spark's port, in the lossless class of the roce role's QoS (DSCP 26, ECT).
    env = spark["lmcache_server"]["env"]
    assert env["UCX_NET_DEVICES"] == ",".join(EXAMPLE_RDMA_DEVICES) and env["UCX_IB_TRAFFIC_CLASS"] == "106"
