"""The nfs_server role refuses an export to the whole world and a squash to root before it touches anything."""

import json

import pytest

from ._playbook import results, run_json

PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: nfs_server
        tasks_from: validate.yml
"""


def validate(tmp_path, **extra):
    playbook = tmp_path / "validate.yml"
    playbook.write_text(PLAY)
    args = [playbook, "-i", "localhost,"]
    for name, value in {"nfs_server_clients": "10.10.0.0/24", **extra}.items():
        args += ["-e", json.dumps({name: value})]
    rc, report = run_json(tmp_path, *args)
    return rc, " ".join(str(r.get("msg", "")) for r in results(report) if r.get("failed"))


def test_a_data_network_export_passes(tmp_path):
    assert validate(tmp_path) == (0, "")


def test_each_spark_address_passes(tmp_path):
    assert validate(tmp_path, nfs_server_clients=["10.10.0.21", "10.10.0.22", "fd00::23"]) == (0, "")


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"nfs_server_clients": "0.0.0.0/0"}, "never 0.0.0.0/0"),
        ({"nfs_server_clients": ["10.10.0.21", "0.0.0.0/0"]}, "never 0.0.0.0/0"),
        ({"nfs_server_clients": ["10.10.0.21", "spark02"]}, "addresses such as 10.10.0.21"),
        ({"nfs_server_clients": []}, "by default every host of group spark with a kvtier_data_address"),
        ({"nfs_server_anon_uid": "0"}, "not 0: a squashed client would be root"),
        ({"nfs_server_anon_gid": "0"}, "not 0: a squashed client would be root"),
    ],
)
def test_the_world_and_root_are_refused(tmp_path, extra, said):
    rc, message = validate(tmp_path, **extra)
    assert rc != 0 and said in message
