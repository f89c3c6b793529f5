"""`kvtier health -i <inventory> [--json] [--canary] [--prometheus FILE]`: every tier checked, every problem named at
once; with --canary, every tier of every Spark also proven by a canary request that disturbs nothing."""

from __future__ import annotations

import argparse
import json
import sys
import time

from kvtier import exits


def _cmd_health(args: argparse.Namespace) -> int:
    from kvtier.health import checks, report
    from kvtier.inventory import Inventory, InventoryError
    from kvtier.nodes.target import TargetError, from_inventory
    from kvtier.probes import health as h

    try:
        target = from_inventory(Inventory(exits.inventory(args.inventory), args.vault_password_file))
    except (InventoryError, TargetError, exits.NoInventory) as exc:
        print(f"kvtier health: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    started = time.monotonic()
    results, facts = checks.run(target)
    if args.canary:
        from kvtier.proof.canary import Canary

        # Only where the node serves: a canary against a Spark that is down says nothing new.
        down = {c["host"] for c in results if c["tier"] == "serving" and c["status"] == h.ERR}
        results += Canary(target, out=lambda line: print(line, file=sys.stderr)).run(
            [host for host in target.nodes if host not in down]
        )
    seconds = time.monotonic() - started
    if args.prometheus:
        report.write_textfile(args.prometheus, report.prometheus(results, facts))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(report.table(results))
        print(f"({'canaries planted and removed' if args.canary else 'read-only'}; {seconds:.1f} s)")
    return h.exit_status(results)


def command(kvtier: str, inventory: str, textfile: str, canary: bool = False, vault_password_file: str = "") -> list:
    """The argv of a health run that writes the textfile (roles/health_timer's unit runs it)."""
    argv = [kvtier, "health", "-i", inventory, "--prometheus", textfile]
    if vault_password_file:
        argv += ["--vault-password-file", vault_password_file]
    return argv + (["--canary"] if canary else [])


def register(sub) -> None:
    p = sub.add_parser("health", help="check every tier of a running cluster (read-only): status, code, fix")
    exits.add_inventory_argument(p)
    p.add_argument("--vault-password-file", help="for vaulted values (or ANSIBLE_VAULT_PASSWORD_FILE)")
    p.add_argument("--json", action="store_true", help="print the checks as a JSON list")
    p.add_argument(
        "--canary",
        action="store_true",
        help="also prove every tier of every Spark with short canary requests (their own cache entries, removed "
        "after; nothing else is touched)",
    )
    p.add_argument("--prometheus", metavar="FILE", help="also write node_exporter textfile metrics to FILE")
    p.set_defaults(func=_cmd_health)
