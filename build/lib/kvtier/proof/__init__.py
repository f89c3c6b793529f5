"""The tier proof, written once: the lab, the test command and `kvtier prove` all run it.

- `tiers`: the proof itself (one request per Spark and tier, proven from LMCache's counters);
- `target`: what it needs to know about a cluster, read from the inventory that provisioned it;
- `nodes`: how the controller runs a probe on a node (podman exec in the lab, ssh elsewhere);
- `cli`: the `kvtier prove` verb.
"""
