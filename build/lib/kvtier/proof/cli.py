"""`kvtier prove -i <inventory> [--tier l0 l1 l2 l3] [--json] [--disruptive]`: the tier proof on a running cluster."""

from __future__ import annotations

import argparse
import json
import sys

from kvtier import exits
from kvtier.proof import tiers


def _cmd_prove(args: argparse.Namespace) -> int:
    from kvtier.inventory import Inventory, InventoryError
    from kvtier.nodes.target import TargetError, from_inventory

    # Without leave to disturb, the default is what never disturbs: L0.
    wanted = args.tier or (list(tiers.TIERS) if args.disruptive else ["l0"])
    refusals = tiers.refused(wanted, args.disruptive)
    if refusals:
        for line in refusals:
            print(f"refused: {line}", file=sys.stderr)
        print("`kvtier prove --tier l0` never disturbs a serving cluster.", file=sys.stderr)
        return exits.REFUSED
    try:
        target = from_inventory(Inventory(exits.inventory(args.inventory), args.vault_password_file))
    except (InventoryError, TargetError, exits.NoInventory) as exc:
        print(f"kvtier prove: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    log = (lambda line: print(line, file=sys.stderr)) if args.json else print
    try:
        hits = tiers.Proof(target, out=log).run(wanted, args.host or None)
    except (tiers.ProofError, tiers.NodeError) as exc:
        print(f"kvtier prove: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([h.to_dict() for h in hits], indent=2))
    else:
        print("\n".join(tiers.table(hits)))
    return 0 if hits and all(h.proven for h in hits) else 1


def register(sub) -> None:
    parser = sub.add_parser(
        "prove",
        help="prove each tier of a running cluster with real requests and LMCache's counters",
        description=tiers.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    exits.add_inventory_argument(parser)
    parser.add_argument(
        "--tier",
        action="append",
        choices=tiers.TIERS,
        help="a tier to prove (repeat for several; default: l0, or with --disruptive every tier the cluster has)",
    )
    parser.add_argument("--host", action="append", help="a Spark to prove on (repeat; default: every Spark)")
    parser.add_argument(
        "--disruptive",
        action="store_true",
        help="allow the steps that disturb a serving cluster: "
        + "; ".join(f"{t}: {why}" for t, why in tiers.DISRUPTIVE.items()),
    )
    parser.add_argument("--vault-password-file", help="for vaulted inventory values (the L2 admin password)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (progress goes to stderr)")
    parser.set_defaults(func=_cmd_prove)
