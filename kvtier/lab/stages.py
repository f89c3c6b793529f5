"""Named, timed stages of a lab run, with a closing table: what ran, how long it took, what it showed."""

from __future__ import annotations

import dataclasses
import time


class StageFailed(Exception):
    """A stage's check did not hold; the message says what was seen."""


def until(what: str, seconds: float, probe, every: float = 2.0):
    """Poll `probe()` every `every` s until it returns something true, which is returned; StageFailed naming `what`
    after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise StageFailed(f"not within {seconds:.0f} s: {what}")
        time.sleep(every)


def lab_errors() -> tuple:
    """The exceptions a lab stage ends with, each saying what was seen; anything else is a bug and keeps its
    traceback. (A function: these modules import this one.)"""
    from kvtier import wheelhouse
    from kvtier.bench import ttft
    from kvtier.inventory import InventoryError
    from kvtier.lab import fabric
    from kvtier.nodes import target, transport
    from kvtier.proof import tiers
    from kvtier.vm import host

    return (
        StageFailed,
        ttft.BenchError,
        fabric.FabricError,
        host.VMError,
        wheelhouse.WheelhouseError,
        tiers.ProofError,
        transport.NodeError,
        target.TargetError,
        InventoryError,
    )


@dataclasses.dataclass
class Stage:
    name: str
    seconds: float = 0.0
    status: str = "ok"  # ok, FAILED, skipped
    note: str = ""


class Stages:
    def __init__(self, out=print):
        self.out = out
        self.done: list = []
        self.started = time.monotonic()

    def run(self, name: str, step, *args, **kwargs):
        """Run step(*args, **kwargs) as the stage `name`; its return value, if a str, is the stage's note.
        A StageFailed (or any other exception) marks the stage FAILED and is raised again."""
        self.out(f"\n==> {name}")
        stage = Stage(name)
        self.done.append(stage)
        began = time.monotonic()
        try:
            note = step(*args, **kwargs)
            stage.note = note if isinstance(note, str) else ""
            return note
        except BaseException as exc:
            stage.status, stage.note = "FAILED", str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            raise
        finally:
            stage.seconds = time.monotonic() - began

    def skip(self, name: str, why: str) -> None:
        self.out(f"\n==> {name}: skipped, {why}")
        self.done.append(Stage(name, status="skipped", note=why))

    @property
    def ok(self) -> bool:
        return all(s.status != "FAILED" for s in self.done)

    def report(self, title: str) -> None:
        total = time.monotonic() - self.started
        self.out(f"\n{title}: {'passed' if self.ok else 'FAILED'} in {total:.0f} s")
        for s in self.done:
            self.out(f"  {s.name:<52} {s.status:<7} {s.seconds:>5.0f} s  {s.note}")
