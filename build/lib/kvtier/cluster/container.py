"""A rendered service run in a container image under systemd: the install route ``container``.

NVIDIA runs vLLM on DGX Spark from its NGC image (``nvcr.io/nvidia/vllm:<yy.mm>-py3``), whose torch and vLLM are
built for the GB10. The vllm_lmcache role adds LMCache to that image as a venv over the image's own Python, at
the spec's venv path: so the argv `kvtier.cluster.render` computes is the same on both routes, every cache-key
setting with it, and a container node and a venv node serve one cluster side by side.

What the engine's command line adds, and why:
- ``--network host``: LMCache's ZMQ, HTTP, metrics and P2P ports and vLLM's port are the node's own, as the
  router, the coordinator and the peers expect; ``--ipc host`` and ``--pid host``: vLLM and the LMCache server
  share memory and, on CUDA, IPC handles across the two containers; the node's /proc shows the real processes
  (health reads their credentials and key settings there).
- ``--user uid:gid`` of the service user: the L3 directory and the home are the same files as on a venv node.
- ``--env NAME`` without a value: the engine passes the unit's Environment= and EnvironmentFile= values through,
  so secrets stay out of argv and out of the unit.
- podman: ``--cgroups=split`` puts the container's processes in the unit's own cgroup (systemd accounts and stops
  them as the unit's); docker runs them under its daemon.
- GPUs: podman through CDI (``--device nvidia.com/gpu=all``, nvidia-ctk's spec), docker through ``--gpus all``;
  with NVIDIA's ulimits (memlock unlimited, 64 MiB stack).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

ENGINES = ("podman", "docker")
# Container names of the services (one per node, like the units).
NAMES = {"lmcache": "kvtier-lmcache", "vllm": "kvtier-vllm", "coordinator": "kvtier-lmcache-coordinator"}
# Within the units' TimeoutStopSec (15 s for vLLM): the engine's SIGKILL comes before systemd's.
STOP_SECONDS = 10


@dataclass(frozen=True)
class Container:
    """How a node runs its services in containers."""

    engine: str  # podman or docker
    engine_path: str  # absolute path of the engine's client
    image: str  # the serving image: the base image with LMCache added
    user: str  # uid:gid of the service user
    home: str  # the service user's home (caches), mounted read-write and the working directory
    gpus: bool = False
    run_args: tuple = ()  # extra engine arguments (the lab's nested podman needs --cgroupns=host)
    mounts: dict = field(default_factory=dict)  # service -> ((source, target, options), ...)

    def __post_init__(self):
        problems = []
        if self.engine not in ENGINES:
            problems.append(f"container engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if not posixpath.isabs(self.engine_path or ""):
            problems.append(f"container engine path {self.engine_path!r} is not absolute")
        if not self.image:
            problems.append("no serving image given")
        user, _, group = (self.user or "").partition(":")
        if not user or not group or ":" in group:
            problems.append(f"user {self.user!r} is not uid:gid (the service user's ids on the node)")
        if not posixpath.isabs(self.home or ""):
            problems.append(f"home {self.home!r} is not absolute")
        if problems:
            raise ValueError("; ".join(problems))


def _mount(source: str, target: str, options: str) -> list:
    for path in (source, target):
        if not posixpath.isabs(path) or ":" in path or "," in path:
            raise ValueError(f"mount path {path!r} must be absolute, without ':' or ','")
    return ["--volume", f"{source}:{target}:{options}"]


def run_argv(container: Container, service: str, process: dict) -> list:
    """The engine's `run` command for one rendered process ({argv, env, secret_env}): the process's own argv
    after the image, its environment passed through by name."""
    if service not in NAMES:
        raise ValueError(f"unknown service {service!r}; one of {', '.join(NAMES)}")
    argv = [container.engine_path, "run", "--rm", "--name", NAMES[service]]
    argv += ["--network", "host", "--ipc", "host", "--pid", "host"]
    if container.engine == "podman":
        argv.append("--cgroups=split")
    argv += ["--user", container.user, "--workdir", container.home]
    if container.gpus:
        argv += ["--device", "nvidia.com/gpu=all"] if container.engine == "podman" else ["--gpus", "all"]
        # NVIDIA's run command for its vLLM image: RDMA registration (NIXL over RoCE, GDS) pins memory without limit,
        # and PyTorch wants a 64 MiB stack.
        argv += ["--ulimit", "memlock=-1:-1", "--ulimit", "stack=67108864"]
    names = sorted({"HOME", *process.get("env", {}), *process.get("secret_env", {})})
    for name in names:
        argv += ["--env", name]
    argv += _mount(container.home, container.home, "rw")
    for source, target, options in container.mounts.get(service, ()):
        argv += _mount(source, target, options)
    argv += list(container.run_args)
    argv.append(container.image)
    argv += [str(a) for a in process["argv"]]
    return argv


def stop_argv(container: Container, service: str) -> list:
    """Stop the service's container, giving it the unit's stop time."""
    return [container.engine_path, "stop", "--time", str(STOP_SECONDS), NAMES[service]]


def remove_argv(container: Container, service: str) -> list:
    """Remove a container left by a crash (a `run --rm` whose engine died cannot reuse the name)."""
    return [container.engine_path, "rm", "--force", NAMES[service]]
