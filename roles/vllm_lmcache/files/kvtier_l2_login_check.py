"""ExecStartPre of the LMCache server (installed by kvtier's vllm_lmcache role): refuse to start with an L2 login
the L2 server refuses.

LMCache 0.5.6's resp adapter, started with a login the server refuses, never completes a lookup: every request
that reaches L2 waits for ever while vLLM's /health answers 200, so the router keeps sending it requests
(measured in kvtier's lab). Not starting is the better failure: vLLM does not start either, the router sends the
Spark's requests to the others, `systemctl status` says why, and `kvtier health` names L2_AUTH.

An L2 server that does not answer does not stop the start: LMCache's stores and loads then fail at once (a
refused connection) while the other tiers serve, and health names L2_DOWN.

Usage: kvtier_l2_login_check.py HOST PORT, with LMCACHE_RESP_USERNAME and LMCACHE_RESP_PASSWORD in the
environment (the unit's EnvironmentFile). Standard library only; kvtier_resp.py sits beside it.
"""

import os
import sys

from kvtier_resp import RespProtocolError, login_refusal


def main(argv):
    host, port = argv[1], int(argv[2])
    user, password = os.environ.get("LMCACHE_RESP_USERNAME", ""), os.environ.get("LMCACHE_RESP_PASSWORD", "")
    try:
        refusal = login_refusal(host, port, user, password)
    except (OSError, RespProtocolError) as err:
        print(f"kvtier: the L2 server at {host}:{port} does not answer ({err}); starting without it", file=sys.stderr)
        return 0
    if refusal:
        print(
            f"kvtier: the L2 server at {host}:{port} refuses LMCache's login as {user!r} ({refusal}); "
            "not starting, since LMCache would hang every request that reaches L2. Fix the password in this "
            "unit's EnvironmentFile: re-run spark.yml for this host.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
