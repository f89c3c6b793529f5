"""Checks of the tier settings: the cluster spec (validated by kvtier.cluster, not here) and the storage node.

The spec says where L2 and L3 are; the storage node's kv_store and the Sparks' NFS mounts must agree with
it, or LMCache starts and silently never hits (a wrong L2 host or user) or writes L3 to a local disk.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from kvtier.cluster import SpecError, cluster_from_hostvars, load_spec
from kvtier.cluster.inventory import CLUSTER_VAR


def spec_problems(cluster, hostvars, spark_hosts, storage_vars=None) -> tuple:
    """(spec dict or None, problems): the spec assembled from the inventory and validated as a whole.

    `storage_vars`: the storage node's variables the L2 endpoint derives from (`kvtier.cluster.derive`).
    """
    if not spark_hosts:
        return None, []
    if cluster is None:
        return None, [
            f"{CLUSTER_VAR} is not set: define the cluster spec once in group_vars/all "
            f"(see kvtier/cluster/spec.py for its shape)"
        ]
    try:
        spec_dict = cluster_from_hostvars(cluster, hostvars, spark_hosts, storage_vars=storage_vars)
        load_spec(spec_dict)
    except SpecError as exc:
        return None, [f"{CLUSTER_VAR}: {problem}" for problem in exc.problems]
    return spec_dict, []


def storage_agreement(spec_dict: Mapping, storage: str | None, storage_vars: Mapping, spark_vars: Mapping) -> list:
    """L2 must point at the storage node's kv_store; L3 must be on each Spark's NFS mount when it has one."""
    spec = load_spec(spec_dict)
    problems = []
    if spec.l2 is not None and storage is not None:
        expected = (
            ("l2.host", spec.l2.host, "kvtier_data_address", storage_vars.get("kvtier_data_address")),
            ("l2.port", spec.l2.port, "kv_store_port", storage_vars.get("kv_store_port")),
            ("l2.user", spec.l2.user, "kv_store_lmcache_user", storage_vars.get("kv_store_lmcache_user")),
        )
        for key, have, var, want in expected:
            if want is not None and str(have) != str(want):
                problems.append(
                    f"{CLUSTER_VAR}.{key} is {have}, but the storage node {storage} has {var} {want}: "
                    f"LMCache would never reach its L2 tier; make them equal"
                )
    if spec.l3 is not None:
        for host, hv in spark_vars.items():
            mount = hv.get("nfs_client_mount_point")
            if not hv.get("nfs_client_server") or not mount:
                continue
            inside = posixpath.normpath(spec.l3.path).startswith(posixpath.normpath(str(mount)).rstrip("/") + "/")
            if not inside:
                problems.append(
                    f"host {host}: {CLUSTER_VAR}.l3.path {spec.l3.path} is not under its NFS mount "
                    f"nfs_client_mount_point {mount}: the L3 tier would be a local directory, not the "
                    f"shared NVMe pool; put l3.path below the mount point"
                )
    return problems
