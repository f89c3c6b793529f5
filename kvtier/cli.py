"""The `kvtier` command line."""

from __future__ import annotations

import argparse
import os
import sys

from kvtier import __version__, content, exits, images, model, model_staging, warmup, wheelhouse
from kvtier.bench import cli as bench_cli
from kvtier.health import cli as health_cli
from kvtier.plan import cli as plan_cli
from kvtier.proof import cli as proof_cli
from kvtier.vm import cli as vm_cli


def _cmd_images_build(args: argparse.Namespace) -> int:
    names = args.names or sorted(images.RECIPES)
    unknown = [n for n in names if n not in images.RECIPES]
    if unknown:
        print(f"unknown image(s): {', '.join(unknown)}; known: {', '.join(sorted(images.RECIPES))}", file=sys.stderr)
        return 2
    for name in names:
        images.build(images.RECIPES[name], force=args.force)
    return 0


def _cmd_lab(args: argparse.Namespace) -> int:
    from kvtier.lab import hosts, lab  # imports ansible-runner; keep `kvtier images` light

    if args.action == "up":
        return lab.up(check=args.check, provision=args.provision, model=args.model)
    if args.action == "test":
        return lab.test(keep=args.keep, stage=args.stage)
    return {"down": hosts.down, "status": hosts.status, "images": hosts.images_only}[args.action]()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvtier", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kvtier {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    img = sub.add_parser("images", help="container base images for the test hosts")
    img_sub = img.add_subparsers(dest="images_command", required=True)
    img_build = img_sub.add_parser("build", help="build missing or outdated images (offline, mmdebstrap)")
    img_build.add_argument(
        "names", nargs="*", help=f"images to build (default: all of {', '.join(sorted(images.RECIPES))})"
    )
    img_build.add_argument("--force", action="store_true", help="rebuild even if the recipe is unchanged")
    img_build.set_defaults(func=_cmd_images_build)

    vm_cli.register(sub)
    model_staging.register(model.register(sub))
    wheelhouse.register(sub)
    proof_cli.register(sub)
    plan_cli.register(sub)
    health_cli.register(sub)
    warmup.register(sub)
    bench_cli.register(sub)

    lab_parser = sub.add_parser("lab", help="the whole cluster on this machine (podman + QEMU)")
    lab_sub = lab_parser.add_subparsers(dest="lab_command", required=True)
    for name, text in (
        ("up", "build the lab, provision it with playbooks/site.yml, show the tiers working"),
        ("test", "the test command's cluster fixture: a fresh lab, every cluster check as a stage, lab down"),
        ("images", "build what the lab's hosts start from (Spark image, wheelhouse, stand-in vLLM image, VM image)"),
        ("down", "remove everything the lab created"),
        ("status", "list the lab's hosts"),
    ):
        action = lab_sub.add_parser(name, help=text)
        action.set_defaults(func=_cmd_lab, action=name)
        if name == "up":
            action.add_argument(
                "--check",
                action="store_true",
                help="bring up the hosts and only show what site.yml would change (--check --diff)",
            )
            action.add_argument(
                "--model",
                choices=("tiny", "medium"),
                help="the lab's model from now on: tiny (default, fast) or medium (the bench ranks tiers by time)",
            )
            action.add_argument(
                "--provision",
                action="store_true",
                help="run site.yml even when the hosts and its inputs are unchanged since its last good run",
            )
        if name == "test":
            action.add_argument(
                "--keep", action="store_true", help="leave the lab up at the end (to look into a failure)"
            )
            action.add_argument(
                "--stage",
                metavar="KEY",
                help="on the lab that is up, run only this stage's segment of the chain (a stage that leaves a "
                "drift runs with the one that repairs it); an unknown KEY lists them",
            )
    return parser


# What a shell reports for a command whose reader went away (128 + SIGPIPE).
CLOSED_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    """Exit statuses: kvtier.exits (0 good, 1 failed, 2 bad usage or input, 3 refused without consent)."""
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()  # within reach of the except below: a closed pipe shows here, not at exit
        return status
    except content.ContentMissing as exc:
        print(f"kvtier: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    except BrokenPipeError:
        # `kvtier health | head -1`: the reader has all it wanted. Nothing more can be said, and no traceback;
        # stdout goes to /dev/null so that Python's own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(main())
