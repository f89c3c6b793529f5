"""ExecStartPre of vLLM (installed by kvtier's vllm_lmcache role): wait until the node's LMCache server answers.

Both units are Type=simple, so systemd starts vLLM as soon as LMCache's process exists. vLLM then connects to a
server still allocating its DRAM (on a Spark, from the same unified memory vLLM measures as free when it starts),
so it starts only once LMCache's HTTP API answers its health check.

Usage: kvtier_wait_lmcache.py URL SECONDS (URL: LMCache's /healthcheck on loopback). Standard library only.
"""

import sys
import time
import urllib.error
import urllib.request


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status == 200
    except (OSError, urllib.error.URLError):
        return False


def main(argv) -> int:
    url, seconds = argv[1], float(argv[2])
    deadline = time.monotonic() + seconds
    while not answers(url):
        if time.monotonic() > deadline:
            print(f"kvtier: LMCache did not answer {url} within {seconds:.0f} s; vLLM does not start", file=sys.stderr)
            return 1
        time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
