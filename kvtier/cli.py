"""The `kvtier` command line."""

from __future__ import annotations

import argparse
import sys

from kvtier import __version__, images


def _cmd_images_build(args: argparse.Namespace) -> int:
    names = args.names or sorted(images.RECIPES)
    unknown = [n for n in names if n not in images.RECIPES]
    if unknown:
        print(f"unknown image(s): {', '.join(unknown)}; known: {', '.join(sorted(images.RECIPES))}", file=sys.stderr)
        return 2
    for name in names:
        images.build(images.RECIPES[name], force=args.force)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvtier", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kvtier {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    img = sub.add_parser("images", help="container base images for the test hosts")
    img_sub = img.add_subparsers(dest="images_command", required=True)
    img_build = img_sub.add_parser("build", help="build missing or outdated images (offline, mmdebstrap)")
    img_build.add_argument("names", nargs="*", help=f"images to build (default: all of {', '.join(sorted(images.RECIPES))})")
    img_build.add_argument("--force", action="store_true", help="rebuild even if the recipe is unchanged")
    img_build.set_defaults(func=_cmd_images_build)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
