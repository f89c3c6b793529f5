"""How the controller reaches a cluster's nodes: the transport Ansible's inventory describes, the probe scripts
shipped over it, and the running cluster those nodes make up (`target`)."""
