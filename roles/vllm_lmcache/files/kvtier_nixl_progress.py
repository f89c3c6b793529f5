"""Let NIXL's UCX progress thread sleep on an idle node (installed by kvtier's vllm_lmcache role).

nixl 1.5.x's Python API builds every agent with ``pthrDelay = 0`` (nixl/_api.py), and the UCX backend turns
that into ``poll(..., 0)``: its progress thread never sleeps and keeps one core busy on a node that serves
nothing. LMCache creates the agent through that API and passes no NIXL options. The thread also waits on the
UCX worker's event descriptor, so a transfer wakes it at once; the delay only bounds its fallback polling.

A ``.pth`` file imports this module at interpreter start. It does nothing unless KVTIER_NIXL_PROGRESS_DELAY_US
is set (only the LMCache server's unit sets it), and then only wraps the agent constructor of the NIXL
build that gets imported, setting its ``pthrDelay`` (microseconds) before the agent starts its thread.
"""

import importlib.abc
import os
import sys

ENV = "KVTIER_NIXL_PROGRESS_DELAY_US"
MODULES = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api")  # the builds LMCache tries, in its order


def patch(api, delay_us):
    """Make `api` (a loaded nixl _api module) create its agents with pthrDelay = delay_us."""
    bindings = api.nixlBind
    create = bindings.nixlAgent
    if getattr(create, "kvtier_delay_us", None) is not None:
        return

    def agent(name, config):
        config.pthrDelay = delay_us
        return create(name, config)

    agent.kvtier_delay_us = delay_us
    bindings.nixlAgent = agent


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of a NIXL _api module so that `patch` runs once it is loaded."""

    def __init__(self, delay_us):
        self.delay_us = delay_us

    def find_spec(self, name, path, target=None):
        if name not in MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                load, delay_us = spec.loader.exec_module, self.delay_us

                def exec_module(module, load=load, delay_us=delay_us):
                    load(module)
                    patch(module, delay_us)

                spec.loader.exec_module = exec_module
                return spec
        return None


def install(environ=os.environ):
    value = environ.get(ENV, "").strip()
    if not value.isdigit() or int(value) == 0:
        return None
    finder = _AfterImport(int(value))
    sys.meta_path.insert(0, finder)
    return finder


install()
