"""The lab's hosts: the images they start from, the Spark containers and the storage VM, created and removed."""

from __future__ import annotations

import concurrent.futures
import hashlib
import subprocess

from kvtier import images, wheelhouse
from kvtier.lab import credentials, fabric, operator_install, sparks, standin
from kvtier.lab.inventory import (
    CONTAINER_SPARK,
    INVENTORY,
    MODEL_VARS,
    REPO,
    SPARKS,
    SPEC_CHANGE_VARS,
    STATE,
    STORAGE,
    STORAGE_DATA_ADDRESS,
    STORAGE_DATA_NIC,
    STORAGE_SERIALS,
    WHEELHOUSE,
    write_inventory,
)
from kvtier.lab.stages import lab_errors
from kvtier.vm import host, image

# The inputs digest of the lab's last good site.yml.
PROVISIONED = STATE / "provisioned"


# What site.yml reads: a change to any of these makes `lab up` provision again.
PROVISIONING_INPUTS = (
    "ansible.cfg",
    "playbooks",
    "roles",
    "library",
    "module_utils",
    "kvtier/passwords.py",
    "inventory/lab/group_vars",
    "kvtier/cluster",
    "kvtier/probes",
    "kvtier/preflight",
)


# The storage VM's niceness on the lab host (QEMU/TCG; root may lower it below 0).
STORAGE_VM_NICE = -5


def start_storage_vm(out=print) -> tuple:
    """(the storage VM, whether it was started now)."""
    vm = host.VM(STORAGE)
    if vm.running():
        out(f"  {STORAGE}: already running (ssh 127.0.0.1:{vm.ssh_port})")
        return vm, False
    if vm.exists:
        vm.destroy()  # a VM whose QEMU died: start over, the lab holds nothing worth keeping
    img = image.build(log=lambda m: out("  " + m))
    data_nic = host.tap_nic_args(fabric.TAP, host.mac_for(STORAGE + "-data"))
    # One vCPU: robust under TCG. A guest's CPU clock counts the time the host does not run it, so a storage VM
    # starved by the Sparks' busy vLLMs sees its own processes "stuck" for seconds (HAProxy's watchdog then kills the
    # router mid-handshake): QEMU gets a larger share of the host.
    vm.create(STORAGE_SERIALS, img=img, hostname=STORAGE, smp=1, extra_args=data_nic, nice=STORAGE_VM_NICE)
    seconds = vm.wait_ssh(600)
    out(
        f"  {STORAGE}: booted in {seconds:.0f} s, 8 NVMe drives {STORAGE_SERIALS[0]}..{STORAGE_SERIALS[-1]}, "
        f"data NIC {STORAGE_DATA_NIC} at {STORAGE_DATA_ADDRESS} (ssh 127.0.0.1:{vm.ssh_port})"
    )
    return vm, True


def inputs_digest() -> str:
    """A digest of everything site.yml reads: a lab whose hosts and inputs are unchanged needs no new run."""
    digest = hashlib.sha256()
    for top in PROVISIONING_INPUTS:
        root = REPO / top
        files = (
            sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            if root.is_dir()
            else [root]
        )
        for path in files:
            if path.exists():
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def provisioned_digest() -> str | None:
    return PROVISIONED.read_text().strip() if PROVISIONED.exists() else None


def _build_images(out) -> tuple:
    """(the stand-in's reference, the lab's SSH key): every image the hosts start from, built where missing."""
    images.build(images.RECIPES["spark"], log=lambda m: out("  " + m))
    images.build(images.RECIPES["ops"], log=lambda m: out("  " + m))
    wheelhouse.build(str(WHEELHOUSE), log=lambda m: out("  " + m))
    standin_ref = standin.build(str(WHEELHOUSE), log=lambda m: out("  " + m))
    key = image.build(log=lambda m: out("  " + m)).key  # the VM image's key is the lab's key for every host
    return standin_ref, key


def images_only(out=print) -> int:
    """`kvtier lab images`: the test command builds them beside the checks, off the lab's own path."""
    try:
        _build_images(out)
    except (*lab_errors(), subprocess.CalledProcessError) as exc:
        out(f"FAILED: {exc}")
        return 1
    return 0


def create(out, created: list) -> str:
    standin_ref, key = _build_images(out)
    fabric.ensure_network()
    for name, address in SPARKS.items():
        if sparks.start(name, address, key + ".pub", nested=name == CONTAINER_SPARK):
            created.append(name)
        out(
            f"  {name}: container {sparks.container(name)} at {address} "
            f"({'started' if name in created else 'already running'})"
        )
    if operator_install.start_host(key + ".pub"):
        created.append(operator_install.HOST)
    out(f"  {operator_install.HOST}: container {operator_install.CONTAINER} at {operator_install.ADDRESS} (operations)")
    fabric.ensure_tap()
    out(f"  storage VM data NIC: tap {fabric.TAP} on bridge {fabric.bridge()}")
    # ~90 s for 2.5 GB: while the storage VM boots.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        loading = pool.submit(
            standin.load_into, sparks.container(CONTAINER_SPARK), standin_ref, lambda m: out("  " + m)
        )
        vm, started = start_storage_vm(out)
        loading.result()
    if started:
        created.append(STORAGE)
    for name, address in {**SPARKS, operator_install.HOST: operator_install.ADDRESS}.items():
        seconds = sparks.wait_ssh(name, address, key)
        out(f"  {name}: SSH at {address} ({seconds:.0f} s)")
    write_inventory(vm)
    return f"{len(created)} of {len(SPARKS) + 2} hosts created"


def record_provisioned() -> None:
    """Record the inputs of the lab's last good site.yml (`lab up` provisions again when they change)."""
    PROVISIONED.write_text(inputs_digest() + "\n")


def leftovers() -> list[str]:
    """Whatever of the lab still exists."""
    found = [f"VM {STORAGE}"] if host.VM(STORAGE).exists else []
    found += [f"container {name}" for name in sparks.lab_containers()]
    if sparks.volume_exists():
        found.append(f"podman volume {sparks.VOLUME}")
    found += [f"podman volume {name}" for name in sparks.nested_volumes()]
    if fabric.network_exists():
        found.append(f"podman network {fabric.NETWORK}")
    if fabric.link_exists(fabric.TAP):
        found.append(f"tap {fabric.TAP}")
    return found


def _destroy_vm() -> list[str]:
    vm = host.VM(STORAGE)
    existed = vm.exists
    vm.destroy()
    return [f"VM {STORAGE}"] if existed else []


def _forget_inventory() -> list[str]:
    removed = []
    # The secrets belong to the lab that is gone, and so does the record of its last good site.yml.
    for path in (INVENTORY, MODEL_VARS, SPEC_CHANGE_VARS, *credentials.files(STATE), PROVISIONED):
        if path.exists():
            path.unlink()
            removed.append(str(path.relative_to(REPO)))
    return removed


def down(out=print) -> int:
    """Remove everything the lab created. Every step runs even when one fails, then what is left is listed."""
    removed, errors = [], []
    for step in (_destroy_vm, sparks.remove, fabric.remove, _forget_inventory):
        try:
            removed += step()
        except (fabric.FabricError, host.VMError, OSError) as exc:
            errors.append(str(exc))
    out("removed " + ", ".join(removed) if removed else "nothing to remove")
    for error in errors:
        out(f"failed: {error}")
    left = leftovers()
    if left:
        out("still there: " + ", ".join(left))
    return 1 if left or errors else 0


def status(out=print) -> int:
    vm = host.VM(STORAGE)
    if not vm.exists and not sparks.lab_containers():
        out("lab is down")
        return 1
    if vm.exists:
        out(
            f"{STORAGE:<16} {'running' if vm.running() else 'stopped':<8} {STORAGE_DATA_ADDRESS:<14} "
            f"ssh 127.0.0.1:{vm.ssh_port}"
        )
    for name, address in SPARKS.items():
        out(f"{name:<16} {sparks.state(name) or 'absent':<8} {address:<14} container {sparks.container(name)}")
    ops = "running" if operator_install.CONTAINER in sparks.lab_containers() else "absent"
    out(f"{operator_install.HOST:<16} {ops:<8} {operator_install.ADDRESS:<14} container {operator_install.CONTAINER}")
    return 0
