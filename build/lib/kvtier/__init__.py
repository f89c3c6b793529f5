"""kvtier: provision a KV-cache tiered LLM inference cluster and prove that every tier works."""

__version__ = "0.1.0"
