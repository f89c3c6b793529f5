"""Throw-away QEMU/TCG VMs that stand in for the storage node (8 emulated NVMe drives, RDMA via soft-RoCE).

`image` builds and caches the Debian 12 base image, `host` runs one VM from it, `cli` exposes both as
`kvtier vm ...`. Standard library only, plus the qemu, mmdebstrap, e2fsprogs and openssh host tools.
"""
