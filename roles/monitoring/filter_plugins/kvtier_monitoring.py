"""Jinja2 filter for the monitoring role: Prometheus's configuration from the inventory (kvtier.monitoring.targets).

"{{ hostvars | kvtier_scrape_config(groups, monitoring_scrape_interval, [rules_file]) }}"
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
from kvtier.cluster.inventory import plain, spec_dict_of_play
from kvtier.monitoring import targets


def kvtier_scrape_config(hostvars, groups, interval, rule_files):
    groups = plain(groups)
    if not groups.get("spark"):
        raise AnsibleFilterError("monitoring needs the Sparks (group spark): there is nothing to scrape without them")
    try:
        spec = cluster.load_spec(spec_dict_of_play(hostvars, groups))
        view_groups, view = targets.inventory_view(hostvars, groups)
        found = targets.targets(view_groups, view, spec.ports.vllm_http, spec.l2 is not None)
    except (cluster.SpecError, targets.TargetError, KeyError, ValueError) as exc:
        raise AnsibleFilterError(f"Prometheus's targets: {exc}") from None
    return targets.scrape_config(found, str(interval), [str(f) for f in plain(rule_files)])


class FilterModule:
    def filters(self):
        return {"kvtier_scrape_config": kvtier_scrape_config}
