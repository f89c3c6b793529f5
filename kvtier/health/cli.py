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
        inventory = exits.inventory(args.inventory)
        target = from_inventory(Inventory(inventory, args.vault_password_file))
    except (InventoryError, TargetError, exits.NoInventory) as exc:
        print(f"kvtier health: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    started = time.monotonic()
    results, facts = checks.run(target)
    attempt = None
    if args.repair:
        results, facts, attempt = _repair(args, str(inventory), target, results, facts)
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
        if args.repair:
            from kvtier.health import repair

            repair.record(args.prometheus, attempt)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(report.table(results))
        print(f"({'canaries planted and removed' if args.canary else 'read-only'}; {seconds:.1f} s)")
    return h.exit_status(results)


def _repair(args: argparse.Namespace, inventory: str, target, results: list, facts: dict) -> tuple:
    """--repair: the rolling repair of what health names as its to fix, then the checks again; (results, facts, the
    attempt or None)."""
    from kvtier.health import checks, repair

    decision = repair.decide(results)
    if not decision:
        return results, facts, None
    log = sys.stderr if args.json else sys.stdout
    print(f"kvtier health --repair: {', '.join(decision.hosts)} need the rolling repair", file=log, flush=True)
    attempt = repair.run(
        inventory, decision, args.vault_password_file or "", out=lambda line: print(line, file=log, flush=True)
    )
    print(repair.describe(attempt), file=log, flush=True)
    if attempt.outcome == "repaired":
        results, facts = checks.run(target)
    return results, facts, attempt


def command(
    kvtier: str,
    inventory: str,
    textfile: str,
    canary: bool = False,
    vault_password_file: str = "",
    repair: bool = False,
) -> list:
    """The argv of a health run that writes the textfile (roles/health_timer's unit runs it)."""
    argv = [kvtier, "health", "-i", inventory, "--prometheus", textfile]
    if vault_password_file:
        argv += ["--vault-password-file", vault_password_file]
    return argv + (["--canary"] if canary else []) + (["--repair"] if repair else [])


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
    p.add_argument(
        "--repair",
        action="store_true",
        help="when the only faults are ones the rolling repair fixes (L2_RESTARTED_UNDER_LMCACHE, "
        "L2_STORES_FAILING), run playbooks/repair_lmcache.yml on those Sparks under the day-2 lock, then check again",
    )
    p.set_defaults(func=_cmd_health)
