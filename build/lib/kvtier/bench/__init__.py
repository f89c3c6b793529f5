"""Benchmarks that report figures: TTFT per tier and hit rate (ttft), the L3 pool with fio (storage)."""
