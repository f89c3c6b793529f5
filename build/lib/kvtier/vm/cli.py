"""`kvtier vm build|up|down|ls|ssh|unplug`: the QEMU test host from the shell or a molecule playbook.

`register(subparsers)` adds the `vm` command to the kvtier CLI; `python -m kvtier.vm` runs it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from kvtier.vm import host, image


def _build(args) -> int:
    start = time.monotonic()
    img = image.build(force=args.force, log=lambda m: print(m, file=sys.stderr))
    print(json.dumps({"image": img.dir, "seconds": round(time.monotonic() - start, 1)}))
    return 0


def _up(args) -> int:
    img = image.build(log=lambda m: print(m, file=sys.stderr))  # no-op when the recipe is unchanged
    serials = args.serials.split(",") if args.serials else host.default_serials(args.drives, args.serial_prefix)
    extra = []
    if args.data_nic:
        mode, _, port = args.data_nic.partition(":")
        extra = host.data_nic_args(mode, int(port), args.data_mac or host.mac_for(args.name + "-data"))
    vm = host.VM(args.name)
    start = time.monotonic()
    vm.create(
        serials,
        img=img,
        drive_size=args.drive_size,
        ssh_port=args.port,
        mem_mb=args.mem,
        smp=args.smp,
        hostname=args.hostname,
        extra_args=extra + args.qemu_arg,
        drive_opts=args.drive_opts,
    )
    if not args.no_wait:
        try:
            vm.wait_ssh(args.timeout)
        except host.VMError:
            if not args.keep_on_failure:
                vm.destroy()
            raise
    print(
        json.dumps(
            {**vm.instance_config(), "serials": serials, "dir": vm.dir, "seconds": round(time.monotonic() - start, 1)}
        )
    )
    return 0


def _down(args) -> int:
    vms = host.VM.all() if args.all else [host.VM(n) for n in args.names]
    for vm in vms:
        found = os.path.isdir(vm.dir)
        vm.destroy()  # idempotent, so that molecule destroy can always run
        print(f"{vm.name}: {'destroyed' if found else 'not found'}", file=sys.stderr)
    return 0


def _ls(args) -> int:
    rows = []
    for vm in host.VM.all():
        st = vm.state
        plugged = [d["serial"] for d in st.get("drives", []) if d["plugged"]]
        rows.append(
            {
                "name": vm.name,
                "running": vm.running(),
                "pid": st.get("pid"),
                "ssh_port": st.get("ssh_port"),
                "drives": plugged,
                "dir": vm.dir,
            }
        )
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            state = "running" if r["running"] else "stopped"
            print(
                f"{r['name']:20} {state:8} pid {r['pid']:<8} ssh 127.0.0.1:{r['ssh_port']:<6} {len(r['drives'])} nvme"
            )
    return 0


def _ssh(args) -> int:
    vm = host.VM(args.name)
    if not vm.exists:
        print(f"no VM {args.name}", file=sys.stderr)
        return 1
    argv = vm.ssh_argv(*args.command)
    os.execvp(argv[0], argv)


def _unplug(args) -> int:
    host.VM(args.name).unplug(args.serial)
    print(f"{args.name}: unplugged {args.serial}", file=sys.stderr)
    return 0


def _guard(func):
    # VM errors are the user's to fix (name taken, image missing, no SSH): a message, not a traceback.
    def run(args) -> int:
        try:
            return func(args)
        except host.VMError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1

    return run


def register(subparsers) -> None:
    vm = subparsers.add_parser("vm", help="QEMU/TCG test VMs with emulated NVMe drives")
    sub = vm.add_subparsers(dest="vm_command", required=True)

    p = sub.add_parser("build", help="build the VM image unless the cached one matches the recipe (needs root)")
    p.add_argument("--force", action="store_true", help="rebuild even if the recipe is unchanged")
    p.set_defaults(func=_guard(_build))

    p = sub.add_parser("up", help="create and boot a VM; prints its molecule instance config as JSON")
    p.add_argument("name")
    p.add_argument("--drives", type=int, default=8, help="number of NVMe drives (default 8)")
    p.add_argument("--serial-prefix", default="KVT", help="serials are PREFIX0000001.. (default KVT)")
    p.add_argument("--serials", help="comma-separated serials, instead of --drives/--serial-prefix")
    p.add_argument("--drive-size", default="2G", help="size of each sparse drive (default 2G)")
    p.add_argument("--drive-opts", default="", help="extra -device nvme properties, e.g. logical_block_size=4096")
    p.add_argument("--port", type=int, help="host port forwarded to the guest's SSH (default: a free one)")
    p.add_argument("--hostname", help="guest hostname (default: the VM name)")
    p.add_argument("--mem", type=int, default=2048, help="MiB of guest memory")
    p.add_argument("--smp", type=int, default=2, help="vCPUs")
    p.add_argument("--data-nic", metavar="listen:PORT|connect:PORT", help="second NIC (ens16) on a QEMU socket link")
    p.add_argument("--data-mac", help="MAC of the second NIC (default: derived from the name)")
    p.add_argument("--qemu-arg", action="append", default=[], help="extra QEMU argument (repeatable)")
    p.add_argument("--no-wait", action="store_true", help="return once QEMU runs, without waiting for SSH")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for SSH")
    p.add_argument("--keep-on-failure", action="store_true", help="keep a VM that did not come up, to debug it")
    p.set_defaults(func=_guard(_up))

    p = sub.add_parser("down", help="stop VMs and delete their files")
    p.add_argument("names", nargs="*")
    p.add_argument("--all", action="store_true")
    p.set_defaults(func=_guard(_down))

    p = sub.add_parser("ls", help="list VMs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_guard(_ls))

    p = sub.add_parser("ssh", help="log in to a VM as root, or run a command there")
    p.add_argument("name")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=_guard(_ssh))

    p = sub.add_parser("unplug", help="hot-unplug one NVMe drive by serial (simulates a dead drive)")
    p.add_argument("name")
    p.add_argument("serial")
    p.set_defaults(func=_guard(_unplug))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvtier")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
