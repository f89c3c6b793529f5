"""The hardware the planner sizes for: drives, NICs and the DGX Spark, each figure with where it comes from.

Vendor figures are sequential best cases; the planner uses them as ceilings and says so. Give measured
figures (`kvtier bench`, fio) in a hardware file to plan with what a cluster really does:

    # hardware.yml (every key optional)
    sparks: 4
    unified_gib: 119          # usable unified memory per Spark
    nic_gbit: 100             # the data network's line rate
    drive: D5-P5430           # or D7-PS1010, or {name, capacity_tb, read_gbs, write_gbs}
    drives: 8                 # per storage node
    l2_gib: 128               # Valkey/Redis maxmemory per storage node
    storage_nodes: 1          # L2 a Valkey Cluster across them, L3 one array and export each
    prefill_tokens_per_s: 3000
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from kvtier.plan.model import PlanError


@dataclass(frozen=True)
class Drive:
    name: str
    capacity_tb: float  # decimal terabytes, as sold
    read_gbs: float  # sequential read, GB/s (decimal)
    write_gbs: float
    source: str


# Solidigm product briefs (sequential 128 KiB, the capacity points kvtier's example uses); check the one
# for your capacity: QLC write speed rises with capacity.
DRIVES = {
    "D5-P5430": Drive(
        "Solidigm D5-P5430 15.36 TB (PCIe 4.0 x4, QLC)",
        15.36,
        7.0,
        3.0,
        "Solidigm D5-P5430 product brief: up to 7,000 MB/s read, 3,000 MB/s write",
    ),
    "D7-PS1010": Drive(
        "Solidigm D7-PS1010 7.68 TB (PCIe 5.0 x4, TLC)",
        7.68,
        14.5,
        10.0,
        "Solidigm D7-PS1010 product brief: up to 14,500 MB/s read, 10,000 MB/s write",
    ),
}

# Figures with their sources, printed with the plan.
SOURCES = {
    "unified_gib": "DGX Spark: 128 GB LPDDR5x unified memory, 119-121 GiB usable as tools report it (NVIDIA DGX "
    "Spark porting guide and user reports)",
    "memory_gbs": "GB10 LPDDR5x: about 273 GB/s (NVIDIA DGX Spark specifications); a DRAM-to-GPU copy reads and "
    "writes the same memory, so L0 loads at half of it",
    "nic_gbit": "100GbE RoCE data network (kvtier's target); a Spark's ConnectX-7 ports run 200GbE, but a 100GbE "
    "switch links at 100G",
    "rdma_efficiency": "an assumption: large NFS-over-RDMA and NIXL transfers at 90 % of line rate (the vendor's "
    "remote RDMA JBOF test behind this project read ~13 GB/s with 2 MiB blocks); measure yours with the 2 MiB fio "
    "profile (playbooks/files/fio/l3-nfs-2m.fio) and set rdma_efficiency",
    "l2_get_gbs": "LMCache's Redis/Valkey adapter benchmark (Redis 8.2, 8 workers): GET 5.9 GB/s for 4 MB values, "
    "1.4 GB/s for 8 MB values (LMCache docs, remote backends); larger chunks are taken at the 8 MB figure, the "
    "largest measured",
    "prefill": "a DGX Spark's dense BF16 prefill, estimated at 45 TFLOPS of useful compute (vLLM's DGX Spark post: "
    "~1,884 tokens/s prefill for Nemotron-3-Super-120B-A12B NVFP4, ~12B active parameters, so 2 x 12e9 x 1,884); "
    "tokens/s = 45e12 / (2 x parameters); attention's growth with context is not modelled. Pass a measured rate "
    "(cold TTFT / prompt tokens) with --prefill-rate",
}
SPARK_USEFUL_TFLOPS = 45.0
# LMCache's measured GET throughput falls from 5.9 to 1.4 GB/s between 4 MB and 8 MB values.
L2_GET_GBS = ((4 * 10**6, 5.9), (None, 1.4))


@dataclass(frozen=True)
class Hardware:
    sparks: int = 4
    unified_gib: float = 119.0
    memory_gbs: float = 273.0
    nic_gbit: float = 100.0
    rdma_efficiency: float = 0.9
    drive: Drive = DRIVES["D5-P5430"]
    drives: int = 8
    l2_gib: float = 128.0
    prefill_tokens_per_s: float | None = None  # None: estimated from the model's parameters
    l3_fill: float = 0.9  # XFS and free-space headroom on the array
    storage_nodes: int = 1  # each with its own link, L2 shard and array

    @property
    def nic_gbs(self) -> float:
        return self.nic_gbit / 8

    def describe(self) -> str:
        return (
            f"{self.sparks} x DGX Spark ({self.unified_gib:g} GiB unified each), {self.nic_gbit:g}GbE data network, "
            f"{self.drives} x {self.drive.name} in RAID0, L2 {self.l2_gib:g} GiB"
            + (f", on each of {self.storage_nodes} storage nodes" if self.storage_nodes > 1 else "")
        )


def l2_get_gbs(object_bytes: int) -> float:
    for limit, gbs in L2_GET_GBS:
        if limit is None or object_bytes <= limit:
            return gbs
    raise AssertionError("unreachable")


def _drive(value) -> Drive:
    if isinstance(value, str):
        if value not in DRIVES:
            known = ", ".join(DRIVES)
            raise PlanError(
                f"unknown drive {value!r}; known: {known}, or a mapping of name, capacity_tb, read_gbs, write_gbs"
            )
        return DRIVES[value]
    if isinstance(value, Mapping):
        try:
            return Drive(
                str(value["name"]),
                float(value["capacity_tb"]),
                float(value["read_gbs"]),
                float(value["write_gbs"]),
                str(value.get("source", "given in the hardware file")),
            )
        except (KeyError, TypeError, ValueError):
            raise PlanError("drive: give name, capacity_tb, read_gbs and write_gbs") from None
    raise PlanError(f"drive must be a name ({', '.join(DRIVES)}) or a mapping, not {value!r}")


def load(path: str | None = None, **overrides) -> Hardware:
    """The default hardware, updated from a YAML/JSON file and then from `overrides` (None values ignored)."""
    data: dict = {}
    if path:
        try:
            loaded = yaml.safe_load(pathlib.Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise PlanError(f"hardware file {path}: {exc}") from None
        if not isinstance(loaded, Mapping):
            raise PlanError(f"hardware file {path} must be a mapping of settings")
        data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    fields = {f.name: f for f in dataclasses.fields(Hardware)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise PlanError(f"unknown hardware setting(s): {', '.join(unknown)}; known: {', '.join(fields)}")
    values = {}
    for key, value in data.items():
        if key == "drive":
            values[key] = _drive(value)
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise PlanError(f"hardware {key} must be a number, not {value!r}") from None
        if number <= 0 or (key in ("rdma_efficiency", "l3_fill") and number > 1):
            raise PlanError(f"hardware {key} {value!r} is out of range")
        values[key] = int(number) if key in ("sparks", "drives", "storage_nodes") else number
    return dataclasses.replace(Hardware(), **values)
