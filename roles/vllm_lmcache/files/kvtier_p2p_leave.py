"""Take a node's LMCache server out of the P2P group, then stop it (installed by kvtier's vllm_lmcache role).

A peer learns that a server left only from the coordinator, which it polls once per heartbeat interval; a lookup it
sends meanwhile to a server that no longer answers waits for LMCache's lookup timeout. Deregistering alone does not
last: the server's next heartbeat gets a 404 and it registers again one interval later; and a server stopped
gracefully keeps heartbeating while it shuts down, so it can register again after its peers dropped it. So:
1. wait until the server's stores are done (every store task it submitted completed), so nothing is lost below;
2. deregister it, and watch the coordinator closely until its registration comes back (at most two intervals);
3. deregister that one at once: the server cannot register again for the next two intervals (one heartbeat to get
   the 404, one to register), while it still answers every lookup;
4. after a little more than one interval every peer has polled and dropped it: kill it then (SIGKILL to its unit,
   no shutdown during which it could register again; then the unit is stopped, so systemd does not restart it), and
   deregister once more. The restart that follows starts it fresh; it registers when it starts.
An unreachable coordinator is no reason to keep serving: the server is stopped all the same, and that is said.

Usage: kvtier_p2p_leave.py COORDINATOR_URL INSTANCE_ID UNIT HEARTBEAT_SECONDS METRICS_URL. Standard library only.
"""

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

WATCH_S = 0.05
SETTLE_S = 60.0
_SUBMITTED = re.compile(r"^lmcache_mp_l2_store_submitted_requests(?:_total)?(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)
_COMPLETED = re.compile(r"^lmcache_mp_l2_store_completed_requests(?:_total)?(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


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


def leave(base: str, instance: str, stop, interval: float, clock=time.monotonic, sleep=time.sleep) -> str:
    """Steps 2-4 above; `stop()` kills the server's process. Returns what happened, for the task's output."""
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
        stop()
        return f"the coordinator at {base} did not answer ({exc}); {instance} stopped"
    stop()
    deregister(base, instance)
    seen = "its registration came back once and was removed" if back is not None else "it did not register again"
    return f"{instance} deregistered ({seen}), every peer polled since, then stopped"


def main(argv) -> int:
    base, instance, unit, interval, metrics = argv[1].rstrip("/"), argv[2], argv[3], float(argv[4]), argv[5]

    def stop():
        # Killed, then stopped: the stop cancels the restart systemd would schedule for a killed service.
        subprocess.run(["systemctl", "kill", "--signal=SIGKILL", unit], check=True)
        subprocess.run(["systemctl", "stop", unit], check=True)

    settled = settle(metrics)
    print(f"{settled}; {leave(base, instance, stop, interval)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
