"""The stdlib RESP client: encoding, reply parsing, INFO parsing, against a real server when one is at hand."""

import pytest

from kvtier.probes import resp


def test_encode_command_uses_bulk_strings():
    assert resp.encode_command("SET", "k", b"\x00v", 5) == b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\x00v\r\n$1\r\n5\r\n"


@pytest.mark.parametrize(
    "wire, value",
    [
        (b"+OK\r\n", "OK"),
        (b":42\r\n", 42),
        (b"$5\r\nhello\r\n", b"hello"),
        (b"$-1\r\n", None),
        (b"*2\r\n$3\r\nfoo\r\n:1\r\n", [b"foo", 1]),
        (b"$4\r\na\r\nb\r\n", b"a\r\nb"),  # binary-safe: CRLF inside a bulk string
    ],
)
def test_parse_reply(wire, value):
    assert resp.parse_reply(wire) == value


def test_error_reply_raises_with_server_text():
    with pytest.raises(resp.RespError, match="^NOAUTH Authentication required"):
        resp.parse_reply(b"-NOAUTH Authentication required.\r\n")


def test_garbage_is_a_protocol_error():
    with pytest.raises(resp.RespProtocolError):
        resp.parse_reply(b"?what\r\n")


def test_reader_reassembles_fragmented_replies():
    pieces = [b"*2\r\n$3\r", b"\nfo", b"o\r\n:", b"7\r\n"]
    reader = resp._Reader(lambda _n: pieces.pop(0))
    assert reader.reply() == [b"foo", 7]


def test_closed_connection_is_reported():
    reader = resp._Reader(lambda _n: b"")
    with pytest.raises(ConnectionError):
        reader.reply()


INFO_VALKEY = (
    "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n\r\n"
    "# Memory\r\nused_memory:1024\r\nmaxmemory_policy:allkeys-lru\r\n"
)
INFO_REDIS = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n"


def test_parse_info_and_identity():
    info = resp.parse_info(INFO_VALKEY)
    assert info["used_memory"] == "1024"
    assert resp.server_identity(info) == ("valkey", "8.1.1")
    assert resp.server_identity(resp.parse_info(INFO_REDIS)) == ("redis", "7.0.15")


def test_client_against_real_server(redis_server):
    with resp.RespClient("127.0.0.1", redis_server) as client:
        with pytest.raises(resp.RespError, match="NOAUTH"):
            client.call("PING")
        with pytest.raises(resp.RespError, match="WRONGPASS"):
            client.auth("probe", "wrong")
        client.auth("probe", "probe-password-1234567")
        assert client.call("PING") == "PONG"
        big = bytes(range(256)) * 1024
        assert client.call("SET", "k", big) == "OK"
        assert client.call("GET", "k") == big
        assert client.config_get("save") == {"save": ""}
        assert "redis_version" in client.info("server")


def test_matching_keys_scans_every_page(redis_server):
    with resp.RespClient("127.0.0.1", redis_server) as client:
        client.auth("probe", "probe-password-1234567")
        for n in range(2500):  # more than one SCAN page (COUNT 1000)
            client.call("SET", f"tiny@00000000@0@{n:064x}@kvtier-canary-a", "v")
        client.call("SET", f"tiny@00000000@0@{1:064x}", "unsalted")
        client.call("SET", f"tiny@00000000@0@{1:064x}@kvtier-canary-b", "another canary")
    keys = resp.matching_keys("127.0.0.1", redis_server, "probe", "probe-password-1234567", "*@kvtier-canary-a")
    assert len(keys) == 2500 and all(k.endswith("@kvtier-canary-a") for k in keys)
