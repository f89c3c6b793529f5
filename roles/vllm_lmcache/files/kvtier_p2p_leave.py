"""Take a node's LMCache server out of the P2P group before it stops (installed by kvtier's vllm_lmcache role).

A peer learns that a server left only from the coordinator, which it polls once per heartbeat interval; a lookup it
sends meanwhile to a server that no longer answers waits for LMCache's lookup timeout. Deregistering alone does not
last: the server's next heartbeat gets a 404 and it registers again one interval later. So:
1. deregister it, and watch the coordinator closely until its registration comes back (at most two intervals);
2. deregister that one at once: the server cannot register again for the next two intervals (one heartbeat to get
   the 404, one to register), while it still answers every lookup;
3. after a little more than one interval every peer has polled and dropped it; freeze it then (SIGSTOP to its unit:
   no heartbeat can bring it back; the stop that follows wakes it, systemd sends SIGCONT with SIGTERM), and
   deregister once more.
An unreachable coordinator is no reason to keep serving: the server is frozen all the same, and that is said.

Usage: kvtier_p2p_leave.py COORDINATOR_URL INSTANCE_ID UNIT HEARTBEAT_SECONDS. Standard library only.
"""

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

WATCH_S = 0.05


def _request(method: str, url: str):
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=5) as reply:  # noqa: S310 (the coordinator's http URL)
        return reply.read()


def registered(base: str, instance: str) -> bool:
    body = json.loads(_request("GET", base + "/instances") or b"[]")
    items = body.get("instances", []) if isinstance(body, dict) else body
    return any(isinstance(item, dict) and item.get("instance_id") == instance for item in items)


def deregister(base: str, instance: str) -> None:
    _request("DELETE", f"{base}/instances/{instance}")


def leave(base: str, instance: str, freeze, interval: float, clock=time.monotonic, sleep=time.sleep) -> str:
    """Steps 1-3 above; `freeze()` stops the server's process. Returns what happened, for the task's output."""
    try:
        deregister(base, instance)
        deadline, back = clock() + 2.5 * interval, None
        while clock() < deadline:
            if registered(base, instance):
                deregister(base, instance)
                back = clock()
                break
            sleep(WATCH_S)
        # Absent now until two intervals after its registration came back (or it is not heartbeating at all).
        sleep(max(0.0, (back if back is not None else clock()) + 1.2 * interval - clock()))
    except (OSError, urllib.error.URLError, ValueError) as exc:
        freeze()
        return f"the coordinator at {base} did not answer ({exc}); {instance} frozen"
    freeze()
    deregister(base, instance)
    seen = "its registration came back once and was removed" if back is not None else "it did not register again"
    return f"{instance} deregistered ({seen}), every peer polled since, then frozen"


def main(argv) -> int:
    base, instance, unit, interval = argv[1].rstrip("/"), argv[2], argv[3], float(argv[4])

    def freeze():
        subprocess.run(["systemctl", "kill", "--signal=SIGSTOP", unit], check=True)

    print(leave(base, instance, freeze, interval))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
