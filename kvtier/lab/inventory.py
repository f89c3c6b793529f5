"""The lab's shape: its hosts, their addresses, the inventory written for them, and the model it serves."""

from __future__ import annotations

import contextlib
import os
import pathlib

import yaml

from kvtier.inventory import Inventory
from kvtier.lab import credentials, fabric, standin
from kvtier.lab.stages import StageFailed
from kvtier.nodes import target
from kvtier.vm import host, image

REPO = pathlib.Path(__file__).resolve().parents[2]


STATE = credentials.STATE


# The lab's wheelhouse (~700 MB) is a per-user cache like the VM image, so a fresh clone on the same machine does
# not fetch and repack it again; the build keeps it while its recipe holds and rebuilds it when the recipe changes.
WHEELHOUSE = pathlib.Path(os.environ.get("KVTIER_LAB_WHEELHOUSE") or os.path.expanduser("~/.cache/kvtier/wheelhouse"))


INVENTORY_DIR = REPO / "inventory" / "lab"


INVENTORY = INVENTORY_DIR / "hosts.yml"


# `kvtier lab up --model medium` writes the lab spec with a bigger model here (group_vars/all, read after lab.yml).
MODEL_VARS = INVENTORY_DIR / "group_vars" / "all" / "zz-model.yml"


# The spec-change stage writes its change here (after zz-model.yml, so it wins); `lab down` removes it.
SPEC_CHANGE_VARS = INVENTORY_DIR / "group_vars" / "all" / "zz-spec-change.yml"


# The lab's models (kvtier model build): tiny proves every path fast; medium makes prefill cost more than a load,
# so the bench tells the tiers apart by time. Medium's KV is 32 KiB per token in float32: a 2000-token context is
# 62 MiB, more than tiny's DRAM and KV sizes hold (LMCache refused to allocate its stores with 0.25 GiB of DRAM).
LAB_MODELS = {
    "tiny": {},
    "medium": {
        "model": {"id": "medium", "path": "/opt/kvtier/models/medium", "weights_gib": 0.11},
        "vllm": {"gpu_kv_cache_gib": 0.25},
        "lmcache": {"l0_dram_gib": 1},
    },
}


STORAGE = "kvtier-storage"


STORAGE_SERIALS = [f"LAB{n:07d}" for n in range(1, 9)]


STORAGE_DATA_ADDRESS = "10.213.7.10"


SPARKS = {"spark01": "10.213.7.21", "spark02": "10.213.7.22"}


# The operations host: the operator's machine, the lab's Prometheus and health timer (kvtier.lab.operator_install).
OPS_HOST, OPS_ADDRESS = "ops01", "10.213.7.30"


# The Spark that runs the container route (its services in the stand-in for NVIDIA's vLLM image, LMCache added by
# the role); the other keeps the venv route. Both routes render the same argv, so they serve one cluster.
CONTAINER_SPARK = "spark02"
# The Spark the node faults stop, start with a wrong L2 password and then with another chunk size (the container
# route's: the health probe finds its processes through the engine). site.yml's next run repairs the chunk size.
FAULTY_SPARK = CONTAINER_SPARK


# The VM's tap NIC sits in PCI slot 0x10: the guest names it ens16.
STORAGE_DATA_NIC = "ens16"


def render(vm: host.VM) -> dict:
    ssh = vm.instance_config()
    prefix = fabric.SUBNET.split("/")[1]
    storage = {
        "ansible_host": ssh["address"],
        "ansible_port": ssh["port"],
        "ansible_user": image.LOGIN_USER,
        "ansible_ssh_private_key_file": ssh["identity_file"],
        # Every lab VM is new; its host key is not worth pinning.
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "kvtier_data_address": STORAGE_DATA_ADDRESS,
        "roce_interface": STORAGE_DATA_NIC,
        "roce_address": f"{STORAGE_DATA_ADDRESS}/{prefix}",
        "nvme_raid_serials": STORAGE_SERIALS,
        # The export admits each Spark, and the storage node itself: the lab's NFS stage mounts it there (the Spark
        # containers cannot mount NFS).
        "nfs_server_clients": [*SPARKS.values(), STORAGE_DATA_ADDRESS],
    }
    # The Sparks: SSH at their lab address with the same key, as Ansible reaches real Sparks.
    spark_hosts = {
        name: {
            "ansible_host": address,
            "ansible_user": image.LOGIN_USER,
            "ansible_ssh_private_key_file": ssh["identity_file"],
            "ansible_ssh_common_args": storage["ansible_ssh_common_args"],
            "kvtier_data_address": address,
            **(_container_route() if name == CONTAINER_SPARK else {}),
        }
        for name, address in SPARKS.items()
    }
    # The operations host (kvtier.lab.operator_install): Prometheus and the health timer run there.
    ops = {
        OPS_HOST: {
            "ansible_host": OPS_ADDRESS,
            "ansible_user": image.LOGIN_USER,
            "ansible_ssh_private_key_file": ssh["identity_file"],
            "ansible_ssh_common_args": storage["ansible_ssh_common_args"],
            "kvtier_data_address": OPS_ADDRESS,
        }
    }
    return {
        "all": {
            "children": {
                "storage": {"hosts": {STORAGE: storage}},
                "spark": {"hosts": spark_hosts},
                "kvtier_monitoring": {"hosts": ops},
            },
            "vars": {
                # An unprivileged login user that becomes root, as on a real cluster (the example inventory's).
                "ansible_become": True,
                **credentials.inventory_vars(STATE, STORAGE_DATA_ADDRESS),
                "vllm_lmcache_wheelhouse": str(WHEELHOUSE),
                # Mitogen compresses its SSH stream by default: on a local bridge that is CPU spent for nothing,
                # and it held the ~700 MB wheelhouse copy to ~6 MB/s per Spark (123 s for two).
                "mitogen_ssh_compression": False,
            },
        }
    }


def _container_route() -> dict:
    return {
        "vllm_lmcache_install_route": "container",
        "vllm_lmcache_container_base_image": standin.NAME,
        # Loaded by `lab up` (no registry here), as an operator loads NVIDIA's image on an offline node.
        "vllm_lmcache_container_pull": False,
        # The Spark is itself a container on a cgroup v1 host: its podman cannot mount a cgroup namespace of its own.
        "vllm_lmcache_container_run_args": ["--cgroupns=host"],
        "vllm_lmcache_container_build_args": ["--cgroupns=host"],
    }


def write_inventory(vm: host.VM) -> None:
    INVENTORY.write_text(
        "# Generated by `kvtier lab up`; lab-only secrets. Do not commit.\n"
        + yaml.safe_dump(render(vm), sort_keys=False)
    )
    os.chmod(INVENTORY, 0o600)


def proof_target() -> target.Target:
    """The tier proof's view of the lab, read from the lab inventory like any other cluster's."""
    return target.from_inventory(Inventory(INVENTORY))


def use_model(name: str) -> str:
    """Make the lab serve one of LAB_MODELS (the next site.yml builds and serves it); what was written."""
    if name not in LAB_MODELS:
        raise StageFailed(f"unknown lab model {name!r}; choose one of {', '.join(LAB_MODELS)}")
    if not LAB_MODELS[name]:
        MODEL_VARS.unlink(missing_ok=True)
        return f"the lab serves its default model ({name})"
    lab_vars = yaml.safe_load((INVENTORY_DIR / "group_vars" / "all" / "lab.yml").read_text())
    cluster = lab_vars["kvtier_cluster"]
    for section, values in LAB_MODELS[name].items():
        cluster[section] = {**cluster[section], **values}
    MODEL_VARS.write_text(
        f"# Generated by `kvtier lab up --model {name}` (`--model tiny` removes it). Do not commit.\n"
        + yaml.safe_dump({"vllm_lmcache_lab_model": name, "kvtier_cluster": cluster}, sort_keys=False)
    )
    return f"the lab serves the {name} model ({MODEL_VARS.relative_to(REPO)})"


@contextlib.contextmanager
def spark_unlisted(name: str):
    """The lab inventory without the Spark `name` (what an operator writes after playbooks/remove_spark.yml) for the
    `with` body; the inventory as it was afterwards, whatever happened."""
    kept = INVENTORY.read_text()
    hosts = yaml.safe_load(kept)
    sparks = hosts["all"]["children"]["spark"]["hosts"]
    if name not in sparks:
        raise StageFailed(f"{name} is not a Spark of the lab inventory")
    del sparks[name]
    try:
        INVENTORY.write_text(kept.splitlines()[0] + "\n" + yaml.safe_dump(hosts, sort_keys=False))
        yield
    finally:
        INVENTORY.write_text(kept)
