"""kvtier's monitoring: the Grafana dashboard for the KV-cache tiers, generated from code."""
