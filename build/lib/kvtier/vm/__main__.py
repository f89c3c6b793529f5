"""`python -m kvtier.vm up NAME ...`: the same as `kvtier vm ...`."""

import sys

from kvtier.vm.cli import main

sys.exit(main(["vm", *sys.argv[1:]]))
