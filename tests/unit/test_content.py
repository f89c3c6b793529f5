"""A controller install finds kvtier's playbooks and roles without a checkout."""

from __future__ import annotations

import pathlib
import runpy
import shutil
import sys

import pytest
import setuptools

from kvtier import content
from kvtier.cluster import derive

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _data_files(monkeypatch) -> list:
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: None)
    return runpy.run_path(str(ROOT / "setup.py"))["data_files"]()


def test_the_install_carries_every_playbook_role_and_module(monkeypatch):
    installed = {f for _, files in _data_files(monkeypatch) for f in files}
    wanted = {
        str(p.relative_to(ROOT))
        for top in ("playbooks", "roles", "library", "module_utils")
        for p in (ROOT / top).rglob("*")
        if (p.is_file() or p.is_symlink()) and "__pycache__" not in p.parts
    }
    assert wanted - installed == set()
    assert {"ansible.cfg", "requirements.yml", "inventory/example/hosts.yml"} <= installed
    assert not any("inventory/lab" in f for f in installed)  # the lab's inventory is the checkout's alone


@pytest.fixture
def fresh_root(monkeypatch):
    content.root.cache_clear()
    derive.role_defaults.cache_clear()
    yield
    content.root.cache_clear()
    derive.role_defaults.cache_clear()


def test_an_install_without_a_checkout_finds_its_content(tmp_path, monkeypatch, fresh_root):
    prefix = tmp_path / "venv"
    for folder, files in _data_files(monkeypatch):
        (prefix / folder).mkdir(parents=True, exist_ok=True)
        for name in files:
            shutil.copyfile(ROOT / name, prefix / folder / pathlib.Path(name).name)  # as pip copies them
    monkeypatch.setattr(content, "_CHECKOUT", tmp_path / "site-packages")  # the package alone, no checkout
    monkeypatch.setattr(sys, "prefix", str(prefix))
    assert content.root() == prefix / "share" / "kvtier"
    assert derive.role_defaults("kv_store")["kv_store_port"] == 6379
    assert (content.root() / "module_utils" / "kvtier_health.py").read_text() == (
        ROOT / "kvtier" / "probes" / "health.py"
    ).read_text()


def test_no_content_anywhere_is_said_not_guessed(tmp_path, monkeypatch, fresh_root):
    monkeypatch.setattr(content, "_CHECKOUT", tmp_path / "site-packages")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(content.site, "getuserbase", lambda: str(tmp_path / "user"))
    with pytest.raises(content.ContentMissing, match="install kvtier with pip"):
        derive.role_defaults("kv_store")
