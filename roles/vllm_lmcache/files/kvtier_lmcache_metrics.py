"""LMCache's counters for Prometheus: GET /metrics is relayed to LMCache's HTTP API on loopback, and nothing else.

LMCache serves its Prometheus metrics on its HTTP API, which also clears and drives the cache, so that API stays on
loopback; this relay is what the network (the firewall admits the monitoring hosts) may read.

    python3 kvtier_lmcache_metrics.py LISTEN_ADDRESS PORT UPSTREAM_URL
"""

import http.server
import socket
import sys
import urllib.error
import urllib.request

UPSTREAM_TIMEOUT = 10.0


def handler(upstream: str):
    class Relay(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the name http.server calls)
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            try:
                with urllib.request.urlopen(upstream, timeout=UPSTREAM_TIMEOUT) as answer:
                    body = answer.read()
                    kind = answer.headers.get("Content-Type", "text/plain; version=0.0.4")
            except (urllib.error.URLError, OSError) as exc:
                self.send_error(502, f"LMCache's metrics: {getattr(exc, 'reason', exc)}")
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # a scrape every few seconds is not worth a journal line
            pass

    return Relay


def serve(address: str, port: int, upstream: str) -> http.server.ThreadingHTTPServer:
    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        daemon_threads = True

    return Server((address, port), handler(upstream))


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), sys.argv[3]).serve_forever()
