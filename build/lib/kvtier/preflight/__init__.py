"""Preflight: every problem with the controller and the inventory, found before any host is touched.

Each module takes plain data (host vars, group lists, facts) and returns a list of messages, each naming
the host and variable and saying what to change; an empty list means the check passed. The Ansible side
(filter_plugins/kvtier_preflight.py, roles/preflight) collects the data and fails once with all of them.

- `controller`: ansible-core version range, collections, controller Python libraries.
- `groups`: the storage and spark groups.
- `network`: data-network addresses (inside the CIDR, unique), RoCE interface and MTU consistency.
- `tiers`: the cluster spec (validated by kvtier.cluster) and its agreement with the storage node.
- `credentials`: passwords present, long enough, not the example ones (messages carry names only).
- `varnames`: role-prefixed variables that no role declares (misspelt or removed).
- `hardware`: NVMe drives on the storage node, memory and NIC on the Sparks, from facts.
"""
