"""The router's backends from the cluster spec (controller side): every Spark's vLLM at its data address.

    backends: "{{ kvtier_cluster | router_backends(hostvars, groups['spark'], groups['storage'] | default([])) }}"

The Sparks, their addresses and vLLM ports come from kvtier.cluster, the same spec every other role renders
from, so the router cannot point at a port or address the Sparks do not use.
"""

from __future__ import annotations

import pathlib
import sys

from ansible.errors import AnsibleFilterError

try:
    import kvtier  # noqa: F401  (the package must import)
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from kvtier import cluster
from kvtier.cluster import derive, render
from kvtier.cluster.inventory import plain


def router_backends(cluster_var, hostvars, spark_hosts, storage_hosts=()):
    """[{name, address, port}] for every Spark, in the spec's order."""
    storage = [str(h) for h in storage_hosts or []]
    storage_vars = None
    if len(storage) == 1:
        variables = hostvars[storage[0]]
        storage_vars = {name: plain(variables[name]) for name in derive.STORAGE_VARS if name in variables}
    try:
        spec_dict = cluster.cluster_from_hostvars(cluster_var, hostvars, spark_hosts, "kvtier_cluster", storage_vars)
        return render.router_backends(cluster.load_spec(spec_dict))
    except (cluster.SpecError, render.RenderError, ValueError) as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"router_backends": router_backends}
