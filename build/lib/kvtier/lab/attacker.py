"""The lab's attacker: a host on the data network that is not in the inventory, and local users on a Spark, try each
of kvtier's ports; every attempt must be refused, and the same connection from a source the firewall admits must
get through (so a row cannot pass because its service is down).

What is tried is a TCP connection: refused means no byte of a request (the pickle payload for LMCache's port, an
instance removal for the coordinator's, a prompt for vLLM's) reaches the service. Rejected by the firewall, it is
refused at once (a reset), never a timeout.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess

from kvtier import images
from kvtier.lab import fabric
from kvtier.lab.stages import StageFailed

ADDRESS = "10.213.7.99"
CONTAINER = "kvtier-lab-attacker"
IMAGE = images.RECIPES["spark"].name
# One connection attempt, standard library only: "open", "refused" or what else happened.
PROBE = """
import json, socket, sys
def reach(host, port):
    try:
        socket.create_connection((host, port), 5).close()
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timeout"
    except OSError as exc:
        return "error: " + str(exc)
print(json.dumps([reach(h, int(p)) for h, p in json.loads(sys.argv[1])]))
"""


@dataclasses.dataclass(frozen=True)
class Row:
    what: str
    address: str
    port: int
    allowed: str  # where the positive control runs: a Spark's name, "storage" or "host" (the lab's own machine)
    local_user: str = ""  # the row runs as this local user on `allowed`'s Spark instead of from the attacker


def ucx_port(t, node) -> int:
    """The port UCX's TCP transport listens on for NIXL on `node`: one of the spec's range, or the stage fails (UCX
    would have taken a port the firewall does not know)."""
    first, last = t.spec.p2p.ucx_tcp_ports
    listening = set()
    for line in t.nodes[node.name].run("ss", "-Hltn").splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[3].rpartition(":")[2].isdigit():
            listening.add(int(fields[3].rpartition(":")[2]))
    inside = sorted(p for p in listening if first <= p <= last)
    if not inside:
        raise StageFailed(
            f"{node.name}: nothing listens in UCX's range {first}-{last} (listening: {sorted(listening)})"
        )
    return inside[0]


def rows(t, storage_address: str, router_stats_port: int, login_user: str) -> list:
    spec = t.spec
    first, second = (n for n in spec.nodes[:2])
    coordinator = spec.p2p.coordinator
    return [
        Row(
            "LMCache's server port (P2P lookups; the pickle path on the CPU build)",
            first.data_address,
            first.ports.lmcache_zmq,
            second.name,
        ),
        Row(
            "the P2P coordinator (instances: list, register, remove)",
            coordinator.address,
            coordinator.port,
            second.name,
        ),
        Row("NIXL's side channel", first.data_address, first.p2p_advertise_port, second.name),
        Row("NIXL's transfers (UCX's TCP listener)", first.data_address, ucx_port(t, first), second.name),
        Row("a Spark's vLLM, around the router", second.data_address, second.ports.vllm_http, "storage"),
        Row("the L2 server (Valkey/Redis)", storage_address, spec.l2.port, first.name),
        Row("the NFS export (L3)", storage_address, 2049, first.name),
        Row("the router's statistics page", storage_address, router_stats_port, "host"),
        Row(
            f"LMCache's server port from a local user ({login_user}) on a Spark",
            first.data_address,
            first.ports.lmcache_zmq,
            first.name,
            login_user,
        ),
        Row(
            f"the L2 server from a local user ({login_user}) on a Spark",
            storage_address,
            spec.l2.port,
            first.name,
            login_user,
        ),
    ]


def _attacker(targets: list) -> list:
    """The attempts from a container on the data network at ADDRESS, in the inventory nowhere."""
    proc = subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            "--name",
            CONTAINER,
            "--label",
            fabric.LABEL,
            "--network",
            fabric.NETWORK,
            "--ip",
            ADDRESS,
            IMAGE,
            "python3",
            "-c",
            PROBE,
            json.dumps(targets),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise StageFailed(f"the attacker container did not run: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def _from(t, vm, source: str, targets: list, user: str = "") -> list:
    """The same attempts from an allowed source (or as `user` on a Spark)."""
    argv = ["python3", "-c", PROBE, json.dumps(targets)]
    if source == "host":
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
        return json.loads(proc.stdout)
    if source == "storage":
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
        return json.loads(vm.ssh(quoted).stdout)
    node = t.nodes[source]
    return json.loads(node.run(*(["sudo", "-u", user] if user else []), *argv))


def run(out, t, vm, storage_address: str, router_stats_port: int, login_user: str, service_user: str) -> str:
    """Every row refused from where it must be, and open from where it may be; the table in the stage's output."""
    table = rows(t, storage_address, router_stats_port, login_user)
    remote = [r for r in table if not r.local_user]
    attacked = dict(zip(remote, _attacker([(r.address, r.port) for r in remote]), strict=True))
    for row in (r for r in table if r.local_user):
        attacked[row] = _from(t, vm, row.allowed, [(row.address, row.port)], row.local_user)[0]
    allowed = {}
    for row in table:
        user = service_user if row.local_user else ""
        allowed[row] = _from(t, vm, row.allowed, [(row.address, row.port)], user)[0]
    bad = []
    for row in table:
        control = f"as {service_user} on {row.allowed}" if row.local_user else f"from {row.allowed}"
        attacker = row.local_user and f"as {row.local_user}" or f"from {ADDRESS}"
        out(f"  {row.what} ({row.address}:{row.port}): {attacker} {attacked[row]}; {control} {allowed[row]}")
        if attacked[row] != "refused" or allowed[row] != "open":
            bad.append(f"{row.what}: {attacker} {attacked[row]}, {control} {allowed[row]}")
    if bad:
        raise StageFailed("; ".join(bad))
    return f"{len(table)} attempts refused, each open from a source the firewall admits"
