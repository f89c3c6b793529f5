"""A DGX Spark's unified-memory budget and the vLLM memory flags that fit it (used by the planner and rendering).

One pool holds the model weights, vLLM's GPU KV cache, the LMCache server's DRAM (kvtier's L0), the runtimes'
overhead and the OS. The LMCache server starts first and takes its DRAM; vLLM then refuses to start unless
`gpu_memory_utilization x total` is free, whatever `--kv-cache-memory-bytes` says. So the utilization vLLM is
given is the share left after LMCache's DRAM and the OS reserve, and that share must hold the weights, the KV
cache and the runtime overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class Budget:
    unified_gib: float
    weights_gib: float
    gpu_kv_cache_gib: float
    l0_dram_gib: float
    runtime_overhead_gib: float
    os_reserve_gib: float

    def parts(self) -> tuple:
        """(spec key, GiB) of everything that shares the pool."""
        return (
            ("model.weights_gib", self.weights_gib),
            ("vllm.gpu_kv_cache_gib", self.gpu_kv_cache_gib),
            ("lmcache.l0_dram_gib", self.l0_dram_gib),
            ("memory.runtime_overhead_gib", self.runtime_overhead_gib),
            ("memory.os_reserve_gib", self.os_reserve_gib),
        )

    @property
    def used_gib(self) -> float:
        return sum(value for _, value in self.parts())

    @property
    def free_gib(self) -> float:
        return self.unified_gib - self.used_gib

    @property
    def gpu_memory_utilization(self) -> float:
        """The share vLLM may claim: what LMCache's DRAM and the OS leave, rounded down to 0.01."""
        share = (self.unified_gib - self.l0_dram_gib - self.os_reserve_gib) / self.unified_gib
        return max(0.0, math.floor(share * 100 + 1e-9) / 100)

    @property
    def vllm_gib(self) -> float:
        return self.weights_gib + self.gpu_kv_cache_gib + self.runtime_overhead_gib

    @property
    def kv_cache_memory_bytes(self) -> int:
        return int(self.gpu_kv_cache_gib * GIB)

    def problems(self, where: str) -> list:
        """What does not fit, each saying by how much and what to lower; [] when it fits."""
        if self.free_gib < 0:
            terms = " + ".join(f"{label} {value:g}" for label, value in self.parts())
            return [
                f"{where}: memory over budget: {terms} = {self.used_gib:g} GiB, more than its {self.unified_gib:g} "
                f"GiB of unified memory; lower lmcache.l0_dram_gib or vllm.gpu_kv_cache_gib by "
                f"{-self.free_gib:g} GiB in total"
            ]
        claim = self.gpu_memory_utilization * self.unified_gib
        if self.vllm_gib > claim + 1e-9:
            return [
                f"{where}: vLLM needs {self.vllm_gib:g} GiB (weights, KV cache, overhead) but may claim only "
                f"{claim:.2f} GiB (--gpu-memory-utilization {self.gpu_memory_utilization:.2f}, after LMCache's DRAM "
                f"and the OS reserve); lower vllm.gpu_kv_cache_gib by {self.vllm_gib - claim:.2f} GiB"
            ]
        return []


def largest_gpu_kv_cache_gib(unified_gib, weights_gib, l0_dram_gib, runtime_overhead_gib, os_reserve_gib) -> float:
    """The largest GPU KV cache that fits next to everything else (0 when nothing is left)."""
    probe = Budget(unified_gib, weights_gib, 0.0, l0_dram_gib, runtime_overhead_gib, os_reserve_gib)
    room = probe.gpu_memory_utilization * unified_gib - weights_gib - runtime_overhead_gib
    return max(0.0, math.floor(room * 100) / 100)
