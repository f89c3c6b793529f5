"""The local lab: the whole cluster on one machine, provisioned by the same site.yml as a real one."""
