"""`kvtier health -i <inventory> [--json] [--prometheus FILE]`: every tier checked, every problem named at once."""

from __future__ import annotations

import argparse
import json
import sys
import time


def _cmd_health(args: argparse.Namespace) -> int:
    from kvtier.health import checks, report
    from kvtier.inventory import Inventory, InventoryError
    from kvtier.probes import health as h
    from kvtier.proof.target import TargetError, from_inventory

    try:
        target = from_inventory(Inventory(args.inventory, args.vault_password_file))
    except (InventoryError, TargetError) as exc:
        print(f"kvtier health: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    results, facts = checks.run(target)
    seconds = time.monotonic() - started
    if args.prometheus:
        report.write_textfile(args.prometheus, report.prometheus(results, facts))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(report.table(results))
        print(f"(read-only; {seconds:.1f} s)")
    return h.exit_status(results)


def register(sub) -> None:
    p = sub.add_parser("health", help="check every tier of a running cluster (read-only): status, code, fix")
    p.add_argument("-i", "--inventory", required=True, help="the inventory the cluster was provisioned with")
    p.add_argument("--vault-password-file", help="for vaulted values (or ANSIBLE_VAULT_PASSWORD_FILE)")
    p.add_argument("--json", action="store_true", help="print the checks as a JSON list")
    p.add_argument("--prometheus", metavar="FILE", help="also write node_exporter textfile metrics to FILE")
    p.set_defaults(func=_cmd_health)
