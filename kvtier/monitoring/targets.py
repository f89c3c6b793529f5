"""What Prometheus scrapes in a kvtier cluster, read from the inventory: every exporter of every node with its port,
the `host` label each target carries (its inventory name, which the rules and the dashboard group by), and the
ports the firewall opens to the monitoring hosts for it.

One table (EXPORTERS) says which group runs which exporter and on which port, so the scrape configuration, the
firewall and the roles that start the exporters cannot disagree.
"""

from __future__ import annotations

import dataclasses
import ipaddress

from kvtier.cluster.inventory import REMOVING_GROUP


@dataclasses.dataclass(frozen=True)
class Exporter:
    job: str  # Prometheus's job label
    groups: tuple  # the inventory groups whose hosts run it
    port_var: str  # the inventory variable that moves its port (the role's default when unset)
    default_port: int
    what: str
    needs_l2: bool = False  # runs only where the cluster has an L2 tier


EXPORTERS = (
    Exporter(
        "node",
        ("spark", "storage", "kvtier_router", "kvtier_monitoring"),
        "node_exporter_port",
        9100,
        "node_exporter: the host, its file systems, and the health textfile on the monitoring host",
    ),
    Exporter("vllm", ("spark",), "vllm_http", 8000, "vLLM's own /metrics (TTFT, requests)"),
    Exporter(
        "lmcache",
        ("spark",),
        "vllm_lmcache_metrics_port",
        9481,
        "LMCache's counters, relayed from its loopback HTTP API (nothing else of that API)",
    ),
    Exporter("l2", ("storage",), "kv_store_exporter_port", 9121, "the L2 server (Valkey/Redis)", needs_l2=True),
    Exporter("router", ("kvtier_router",), "router_metrics_port", 8405, "HAProxy's Prometheus endpoint"),
)


@dataclasses.dataclass(frozen=True)
class Target:
    job: str
    host: str  # inventory name: the `host` label
    address: str
    port: int
    what: str

    @property
    def endpoint(self) -> str:
        version = ipaddress.ip_address(self.address).version
        return f"[{self.address}]:{self.port}" if version == 6 else f"{self.address}:{self.port}"


class TargetError(ValueError):
    """A host that should be scraped has no data address to scrape it at."""


def targets(groups: dict, hostvars: dict, vllm_port: int, has_l2: bool) -> list:
    """Every target of the cluster: `groups` maps a group to its hosts, `hostvars` a host to its variables (its
    `kvtier_data_address` and any port variable set in the inventory); vLLM's port comes from the cluster spec."""
    found = []
    for exporter in EXPORTERS:
        if exporter.needs_l2 and not has_l2:
            continue
        seen = set()
        for group in exporter.groups:
            for host in groups.get(group) or []:
                if host in seen:
                    continue
                seen.add(host)
                variables = hostvars.get(host) or {}
                address = variables.get("kvtier_data_address")
                if not address:
                    raise TargetError(f"{host} ({group}) has no kvtier_data_address for Prometheus to scrape")
                port = vllm_port if exporter.job == "vllm" else variables.get(exporter.port_var, exporter.default_port)
                found.append(Target(exporter.job, host, str(address), int(port), exporter.what))
    return found


def scraped_on(found: list, host: str) -> list:
    """(what, port) of every exporter on `host` but vLLM (whose port the firewall already filters)."""
    return [(t.what, t.port) for t in found if t.host == host and t.job != "vllm"]


def scrape_config(found: list, interval: str, rule_files: list) -> dict:
    """Prometheus's configuration: one job per exporter, each target labelled with its host.

    The node job honours the labels it scrapes: the health textfile's series name the node checked in their own
    `host` label, which must win over the monitoring host's."""
    jobs = []
    for exporter in EXPORTERS:
        mine = [t for t in found if t.job == exporter.job]
        if not mine:
            continue
        job = {
            "job_name": exporter.job,
            "static_configs": [{"targets": [t.endpoint], "labels": {"host": t.host}} for t in mine],
        }
        if exporter.job == "node":
            job["honor_labels"] = True
        jobs.append(job)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": list(rule_files),
        "scrape_configs": jobs,
    }


# What `targets` reads of each host's variables.
HOST_VARS = ("kvtier_data_address", *(e.port_var for e in EXPORTERS if e.job != "vllm"))
MONITORING_GROUP = "kvtier_monitoring"
PROMETHEUS_PORT = 9090


def inventory_view(hostvars, groups: dict) -> tuple:
    """(groups, variables) of the hosts `targets` looks at, as plain values, from Ansible's hostvars and groups; a
    Spark being removed (playbooks/remove_spark.yml) is no longer looked at."""
    removing = {str(h) for h in groups.get(REMOVING_GROUP) or []}
    groups = {g: [str(h) for h in groups.get(g) or [] if str(h) not in removing] for e in EXPORTERS for g in e.groups}
    wanted = {h for hosts in groups.values() for h in hosts}
    view = {}
    for host in sorted(wanted):
        variables = hostvars[host]
        view[host] = {name: variables.get(name) for name in HOST_VARS if variables.get(name) not in (None, "")}
    return groups, view


def scrapers(groups: dict, variables: dict) -> tuple:
    """The monitoring hosts' data addresses: what the firewall admits to the exporters."""
    found = []
    for host in groups.get(MONITORING_GROUP) or []:
        address = (variables.get(host) or {}).get("kvtier_data_address")
        if not address:
            raise TargetError(f"{host} ({MONITORING_GROUP}) has no kvtier_data_address to admit its scrapes by")
        found.append(str(address))
    return tuple(found)
