"""Probes: read-only checks of a tier, written once for the Ansible modules and the CLI.

Every module here is standard library only, because the Ansible modules ship it to targets
(through module_utils symlinks) where kvtier is not installed.
"""
