"""Jinja2 filter for the firewall role: the host's rules from the cluster spec (kvtier.cluster.firewall).

    "{{ hostvars | kvtier_firewall_rules(groups, inventory_hostname, settings) }}"

settings: admin (list), clients (list), service_uid (int or none), router_port, router_stats_port, prometheus_port.
Returns {input: [...], output: [...]}, each rule {what, proto, port, v4, v6, owners}.
"""

from __future__ import annotations

import pathlib
import sys

from ansible.errors import AnsibleFilterError

try:
    from kvtier import cluster as _cluster  # noqa: F401  (the package must import)
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from kvtier import cluster
from kvtier.cluster import firewall
from kvtier.cluster.inventory import plain, spec_dict_of_play
from kvtier.monitoring import targets


def _rule(rule: firewall.Rule) -> dict:
    return {
        "what": rule.what,
        "proto": rule.proto,
        "port": rule.port,
        "v4": list(rule.family(4)),
        "v6": list(rule.family(6)),
        "owners": list(rule.owners),
    }


def kvtier_firewall_rules(hostvars, groups, host, settings):
    settings, groups, host = plain(settings), plain(groups), str(host)
    storage = [str(h) for h in groups.get("storage") or []]
    if not groups.get("spark"):
        raise AnsibleFilterError("the firewall needs the Sparks (group spark): their data addresses are the cluster")
    try:
        spec = cluster.load_spec(spec_dict_of_play(hostvars, groups))
    except (cluster.SpecError, KeyError, ValueError) as exc:
        raise AnsibleFilterError(f"the firewall cannot read the cluster spec: {exc}") from None
    store = None
    if len(storage) == 1:
        address = plain(hostvars[storage[0]].get("kvtier_data_address"))
        store = firewall.Storage(storage[0], str(address)) if address else None
    router = None
    routers = groups.get("kvtier_router") or []
    if routers:
        address = plain(hostvars[str(routers[0])].get("kvtier_data_address"))
        if not address:
            raise AnsibleFilterError(f"the router host {routers[0]} has no kvtier_data_address to admit it by")
        router = firewall.Router(
            str(routers[0]), str(address), int(settings["router_port"]), int(settings["router_stats_port"])
        )
    uid = settings.get("service_uid")
    try:
        monitored_groups, monitored = targets.inventory_view(hostvars, groups)
        scraped = targets.targets(monitored_groups, monitored, spec.ports.vllm_http, spec.l2 is not None)
        scrapers = targets.scrapers(monitored_groups, monitored)
    except targets.TargetError as exc:
        raise AnsibleFilterError(f"the firewall cannot place the monitoring hosts: {exc}") from None
    monitoring = host in (groups.get(targets.MONITORING_GROUP) or [])
    found = firewall.rules(
        spec,
        host,
        store,
        router,
        admin=tuple(str(a) for a in settings.get("admin") or []),
        clients=tuple(str(c) for c in settings.get("clients") or []),
        service_uid=int(uid) if uid not in (None, "") else None,
        scrapers=scrapers,
        scraped=tuple(targets.scraped_on(scraped, host)),
        prometheus_port=int(settings.get("prometheus_port") or targets.PROMETHEUS_PORT) if monitoring else None,
    )
    return {"input": [_rule(r) for r in found.input], "output": [_rule(r) for r in found.output]}


class FilterModule:
    def filters(self):
        return {"kvtier_firewall_rules": kvtier_firewall_rules}
