"""Take a node's LMCache server out of the P2P group before it stops (installed by kvtier's vllm_lmcache role).

A peer learns that a server left only from the coordinator, which it polls; a lookup it sends meanwhile to a server
that no longer answers waits for LMCache's lookup timeout. Deregistering alone does not last: the server's next
heartbeat gets a 404 and it registers again, also while it shuts down. So, while the server still answers every
lookup:
1. wait until its stores are done (every store task it submitted completed), so nothing is lost when it stops;
2. block this node's connections to the coordinator for every user but root (an nftables table of its own,
   `inet kvtier_leave`, in memory only): a refused heartbeat keeps no registration alive and makes none;
3. deregister it. Its peers drop it at their next poll (the playbook then waits until none lists it); it is stopped
   only after that, and `--rejoin` deletes the table before it starts again, so the new server registers.

Usage: kvtier_p2p_leave.py COORDINATOR_URL INSTANCE_ID METRICS_URL, or kvtier_p2p_leave.py --rejoin. Standard library
only; nft on the PATH.
"""

import ipaddress
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

TABLE = "kvtier_leave"
SETTLE_S = 60.0
_SUBMITTED = re.compile(r"^lmcache_mp_l2_store_submitted_requests(?:_total)?(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)
_COMPLETED = re.compile(r"^lmcache_mp_l2_store_completed_requests(?:_total)?(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


def _request(method: str, url: str):
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=5) as reply:  # noqa: S310 (kvtier's own http URLs)
        return reply.read()


def registered(base: str, instance: str) -> bool:
    body = json.loads(_request("GET", base + "/instances") or b"[]")
    items = body.get("instances", []) if isinstance(body, dict) else body
    return any(isinstance(item, dict) and item.get("instance_id") == instance for item in items)


def stores_in_flight(metrics: str) -> int:
    """Store tasks LMCache submitted that no adapter has completed yet, from its Prometheus text."""
    submitted = sum(float(v) for v in _SUBMITTED.findall(metrics))
    return int(submitted - sum(float(v) for v in _COMPLETED.findall(metrics)))


def settle(metrics_url: str, clock=time.monotonic, sleep=time.sleep, read=None) -> str:
    """Wait (at most SETTLE_S) until no store task is in flight and the counts stood still for a second."""
    read = read or (lambda: _request("GET", metrics_url).decode("utf-8", "replace"))
    deadline, previous = clock() + SETTLE_S, None
    while True:
        try:
            text = read()
        except (OSError, urllib.error.URLError) as exc:
            return f"its stores could not be read ({exc})"
        now = (stores_in_flight(text), _SUBMITTED.findall(text))
        if now[0] <= 0 and now == previous:
            return "its stores done"
        if clock() > deadline:
            return f"{now[0]} store task(s) still in flight after {SETTLE_S:.0f} s"
        previous = now
        sleep(1.0)


def block_rules(base: str) -> str:
    """The nft script that refuses every user but root this node's connections to the coordinator at `base`."""
    url = urllib.parse.urlsplit(base)
    family = "ip6" if ipaddress.ip_address(url.hostname).version == 6 else "ip"
    return (
        f"table inet {TABLE}\n"
        f"delete table inet {TABLE}\n"
        f"table inet {TABLE} {{\n"
        "\tchain output {\n"
        "\t\ttype filter hook output priority filter; policy accept;\n"
        f"\t\t{family} daddr {url.hostname} tcp dport {url.port or 80} meta skuid != 0 reject with tcp reset\n"
        "\t}\n"
        "}\n"
    )


def leave(base: str, instance: str, nft) -> str:
    """Steps 2-3 above; `nft(script)` loads an nft script. Returns what happened, for the task's output."""
    nft(block_rules(base))
    try:
        _request("DELETE", f"{base}/instances/{instance}")
        still = registered(base, instance)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return f"the coordinator at {base} did not answer ({exc}); its heartbeats are refused"
    if still:
        raise RuntimeError(f"{instance} is registered at {base} again although its heartbeats are refused")
    return f"{instance} deregistered at {base}, its heartbeats refused until it starts again"


def _nft(script: str) -> None:
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True)


def main(argv) -> int:
    if argv[1:] == ["--rejoin"]:
        _nft(f"table inet {TABLE}\ndelete table inet {TABLE}\n")
        print("its connections to the coordinator are open again")
        return 0
    base, instance, metrics = argv[1].rstrip("/"), argv[2], argv[3]
    print(f"{settle(metrics)}; {leave(base, instance, _nft)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
