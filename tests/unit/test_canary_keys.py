"""A canary's own cache entries: named from LMCache's fs files and RESP keys by their salt, and removed through
LMCache's HTTP API (its DELETE /cache/objects, here a stand-in that records the request)."""

import http.server
import json
import threading

import pytest

from kvtier.probes import lmcache

SALT = "kvtier-canary-1a2b3c4d-1-local"
HASH = "ab" * 32


def test_an_fs_file_name_gives_back_the_object_key():
    name = f"Qwen-SEP-Qwen3-8B@0x01000000@0@{HASH}@{SALT}.data"
    assert lmcache.salted_object_key(name, SALT) == {
        "chunk_hash_hex": HASH,
        "model_name": "Qwen/Qwen3-8B",
        "kv_rank": 0x01000000,
        "object_group_id": 0,
        "cache_salt": SALT,
    }


def test_a_resp_key_gives_back_the_object_key():
    key = lmcache.salted_object_key(f"tiny@01000000@1f@{HASH}@{SALT}", SALT)
    assert key["model_name"] == "tiny" and key["kv_rank"] == 0x01000000 and key["object_group_id"] == 0x1F


@pytest.mark.parametrize(
    "name",
    [
        f"tiny@0x01000000@0@{HASH}.data",  # unsalted: a client's entry, never the canary's
        f"tiny@0x01000000@0@{HASH}@kvtier-canary-other.data",  # another canary
        f"tiny@0x01000000@0@not-hex@{SALT}.data",
        f"tiny@0@{HASH}@{SALT}.data",
        f"{SALT}.data",
    ],
)
def test_names_that_are_not_this_canarys_are_left_alone(name):
    assert lmcache.salted_object_key(name, SALT) is None


def test_l3_keys_are_this_salts_files_only(tmp_path):
    for n in range(3):
        (tmp_path / f"tiny@0x01000000@0@{n:064x}@{SALT}.data").write_bytes(b"kv")
    (tmp_path / f"tiny@0x01000000@0@{9:064x}.data").write_bytes(b"a client's")
    (tmp_path / f"tiny@0x01000000@0@{8:064x}@{SALT}.data.tmp").write_bytes(b"being written")
    keys = lmcache.l3_salted_keys(str(tmp_path), SALT)
    assert [k["chunk_hash_hex"] for k in keys] == [f"{n:064x}" for n in range(3)]


class _ObjectsApi(http.server.BaseHTTPRequestHandler):
    seen: list = []
    answer = {"deleted": 2, "skipped": 0, "ok": True}

    def do_DELETE(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, body))
        data = json.dumps(type(self).answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def objects_api():
    _ObjectsApi.seen, _ObjectsApi.answer = [], {"deleted": 2, "skipped": 0, "ok": True}
    server = http.server.HTTPServer(("127.0.0.1", 0), _ObjectsApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", _ObjectsApi
    server.shutdown()


def test_forget_names_the_keys_the_tier_and_the_adapter(objects_api):
    url, api = objects_api
    keys = [lmcache.salted_object_key(f"tiny@00000000@0@{HASH}@{SALT}", SALT)]
    lmcache.forget(url, keys, "l2", "fs")
    lmcache.forget(url, keys, "l1")
    assert api.seen == [
        ("/cache/objects", {"keys": keys, "tier": "l2", "force": True, "adapter": "fs"}),
        ("/cache/objects", {"keys": keys, "tier": "l1", "force": True}),
    ]


def test_a_failed_removal_is_an_error_not_silence(objects_api):
    url, api = objects_api
    api.answer = {"deleted": 0, "skipped": 0, "ok": False, "error": "connection refused"}
    with pytest.raises(lmcache.ProbeError, match="connection refused"):
        lmcache.forget(url, [], "l2", "resp")
