"""Checks of the inventory groups: exactly one storage node, enough Spark serving nodes."""

from __future__ import annotations

from collections.abc import Mapping


def groups(groups: Mapping, storage_group: str = "storage", spark_group: str = "spark", min_spark: int = 1) -> list:
    problems = []
    storage = list(groups.get(storage_group) or [])
    spark = list(groups.get(spark_group) or [])
    if len(storage) != 1:
        found = f"it has {len(storage)} ({', '.join(storage)})" if storage else "it has none"
        problems.append(
            f"group {storage_group} must have exactly one host (the storage node); {found}: "
            f"put the one storage node under all.children.{storage_group}.hosts"
        )
    if len(spark) < min_spark:
        found = f"it has {len(spark)} ({', '.join(spark)})" if spark else "it has none"
        problems.append(
            f"group {spark_group} must have at least {min_spark} host(s) (the DGX Spark serving nodes); "
            f"{found}: put them under all.children.{spark_group}.hosts"
        )
    return problems
