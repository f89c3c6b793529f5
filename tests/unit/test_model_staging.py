"""Model staging: a local model directory staged with SHA256SUMS, checked with coreutils' sha256sum as the role
does on a node; and the Hub route's checks against recorded Hub metadata (the Hub cannot be reached here)."""

import json
import os
import subprocess
import sys
import types

import pytest

from kvtier import cli, model_staging
from kvtier.model_staging import HubSource, LocalSource, StagingError, stage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _model(path, weights=b"\x00\x01weights" * 1000):
    files = {
        "config.json": b'{"architectures": ["Qwen2ForCausalLM"]}\n',
        "model.safetensors": weights,
        "tokenizer/tokenizer.json": b'{"version": "1.0"}\n',
    }
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(path, rel)), exist_ok=True)
        with open(os.path.join(path, rel), "wb") as fh:
            fh.write(data)
    return files


def test_a_local_model_staged_checks_with_sha256sum(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "staged" / "tiny"
    _model(src)
    report = stage(LocalSource(str(src)), str(dest))
    assert report["changed"] and report["files"] == 3 and report["source"] == str(src)
    # The role's check on a node: coreutils' sha256sum reads the file kvtier wrote.
    check = subprocess.run(["sha256sum", "--strict", "--check", "SHA256SUMS"], cwd=dest, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "tokenizer/tokenizer.json: OK" in check.stdout
    assert oct(os.stat(dest).st_mode & 0o777) == "0o755"
    assert oct(os.stat(dest / "model.safetensors").st_mode & 0o777) == "0o644"
    # Staged and intact: left alone.
    assert stage(LocalSource(str(src)), str(dest))["changed"] is False


def test_a_changed_file_is_found_and_staged_again(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    _model(src)
    stage(LocalSource(str(src)), str(dest))
    (dest / "model.safetensors").write_bytes(b"truncated")
    check = subprocess.run(["sha256sum", "--quiet", "--check", "SHA256SUMS"], cwd=dest, capture_output=True, text=True)
    assert check.returncode != 0 and "model.safetensors: FAILED" in check.stdout
    assert model_staging.differences(str(dest), model_staging.read_sums(str(dest))) == [
        "model.safetensors: content differs from its checksum"
    ]
    assert stage(LocalSource(str(src)), str(dest))["changed"] is True
    assert (dest / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def test_a_source_that_does_not_match_its_own_sums_is_refused(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    _model(src)
    model_staging.write_sums(str(src), model_staging.sums(str(src)))
    (src / "config.json").write_bytes(b"{}")
    with pytest.raises(StagingError, match="config.json: content differs from its checksum"):
        stage(LocalSource(str(src)), str(dest))
    assert not dest.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".staging-")]


def test_not_a_model_and_a_bad_sums_file(tmp_path):
    with pytest.raises(StagingError, match="not a model directory"):
        stage(LocalSource(str(tmp_path)), str(tmp_path / "dest"))
    (tmp_path / "SHA256SUMS").write_text("not-a-digest  config.json\n")
    with pytest.raises(StagingError, match="SHA256SUMS:1: not a sha256sum line"):
        model_staging.read_sums(str(tmp_path))


def test_git_blob_id_is_gits(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"a": 1}\n')
    git = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True)
    assert model_staging.git_blob_sha1(str(path)) == git.stdout.strip()


# --- the Hub route, against recorded Hub metadata ------------------------------------------------------------------
# Stand-ins for huggingface_hub's model_info and snapshot_download (no Hub access here): the metadata has the
# shape the Hub returns with files_metadata=True, an LFS file carrying its sha256 and a git file its blob id.


def _hub(tmp_path, corrupt=None):
    published = tmp_path / "published"
    files = _model(published)
    siblings = []
    for rel in files:
        path = str(published / rel)
        if rel.endswith(".safetensors"):
            lfs = types.SimpleNamespace(sha256=model_staging.sha256_file(path), size=os.path.getsize(path))
            siblings.append(types.SimpleNamespace(rfilename=rel, lfs=lfs, blob_id="ignored"))
        else:
            siblings.append(types.SimpleNamespace(rfilename=rel, lfs=None, blob_id=model_staging.git_blob_sha1(path)))
    calls = []

    def model_info(repo, revision, files_metadata, token):
        calls.append(("model_info", repo, revision, files_metadata, token))
        return types.SimpleNamespace(sha=revision, siblings=siblings)

    def snapshot_download(repo, revision, local_dir, token):
        calls.append(("download", repo, revision, token))
        _model(local_dir, weights=b"flipped" if corrupt == "weights" else b"\x00\x01weights" * 1000)
        if corrupt == "config":
            os.remove(os.path.join(local_dir, "config.json"))

    return model_info, snapshot_download, calls


def test_hub_files_checked_against_the_published_checksums(tmp_path):
    model_info, download, calls = _hub(tmp_path)
    source = HubSource("Qwen/Qwen3-8B", COMMIT, "hf_secret", api=model_info, download=download)
    report = stage(source, str(tmp_path / "qwen"))
    assert report["source"] == f"hf://Qwen/Qwen3-8B@{COMMIT}" and report["files"] == 3
    assert calls == [
        ("model_info", "Qwen/Qwen3-8B", COMMIT, True, "hf_secret"),
        ("download", "Qwen/Qwen3-8B", COMMIT, "hf_secret"),
    ]
    assert set(model_staging.read_sums(str(tmp_path / "qwen"))) == {
        "config.json",
        "model.safetensors",
        "tokenizer/tokenizer.json",
    }


@pytest.mark.parametrize(
    ("corrupt", "expected"),
    [("weights", "model.safetensors: sha256 .* but the Hub publishes"), ("config", "config.json: missing")],
)
def test_hub_download_that_does_not_match_is_refused(tmp_path, corrupt, expected):
    model_info, download, _ = _hub(tmp_path, corrupt)
    with pytest.raises(StagingError, match=expected):
        stage(HubSource("Qwen/Qwen3-8B", COMMIT, api=model_info, download=download), str(tmp_path / "qwen"))
    assert not (tmp_path / "qwen").exists()


def test_hub_revision_must_be_a_commit():
    with pytest.raises(StagingError, match="'main' for Qwen/Qwen3-8B is not a commit: pin the 40-hex commit id"):
        HubSource("Qwen/Qwen3-8B", "main")


# --- the commands ----------------------------------------------------------------------------------------------


def test_kvtier_model_stage(tmp_path, capsys):
    _model(tmp_path / "src")
    assert cli.main(["model", "stage", "--from", str(tmp_path / "src"), str(tmp_path / "dest")]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == 3
    assert cli.main(["model", "stage", "--hub", "Qwen/Qwen3-8B", str(tmp_path / "x")]) == 2
    assert "--hub needs --revision" in capsys.readouterr().err


def test_the_stager_runs_as_a_plain_script_on_a_node(tmp_path):
    """The role copies kvtier/model_staging.py alone into the serving venv: it must need nothing from kvtier."""
    _model(tmp_path / "src")
    script = tmp_path / "kvtier-model-stage.py"
    script.write_text(open(os.path.join(ROOT, "kvtier", "model_staging.py")).read())
    run = subprocess.run(
        [sys.executable, "-I", str(script), "--from", str(tmp_path / "src"), str(tmp_path / "dest")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["changed"] is True


def test_the_hub_token_comes_from_standard_input_when_asked(monkeypatch):
    import argparse
    import io

    parser = argparse.ArgumentParser()
    model_staging.add_arguments(parser)
    monkeypatch.setenv("HF_TOKEN", "from-the-environment")
    args = parser.parse_args(["--hub", "Qwen/Qwen3-8B", "--revision", COMMIT, "--token-stdin", "/tmp/q"])
    assert model_staging._source(args, io.StringIO("hf_from_stdin\n")).token == "hf_from_stdin"
    args = parser.parse_args(["--hub", "Qwen/Qwen3-8B", "--revision", COMMIT, "/tmp/q"])
    assert model_staging._source(args).token == "from-the-environment"
