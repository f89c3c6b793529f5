"""kvtier.model: the parts that need no torch (corpus, config, CLI)."""

import argparse
import subprocess
import sys

import pytest

from kvtier import model


def test_corpus_files_are_sorted_and_non_empty(tmp_path):
    (tmp_path / "b.txt").write_text("beta")
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "dir").mkdir()
    files = model.corpus_files(str(tmp_path / "*"))
    assert [f.rsplit("/", 1)[1] for f in files] == ["a.txt", "b.txt"]
    with pytest.raises(model.ModelError, match="no text files match"):
        model.corpus_files(str(tmp_path / "none*"))


def test_corpus_digest_depends_on_contents_only(tmp_path):
    (tmp_path / "x").write_text("same")
    (tmp_path / "y").write_text("same")
    assert model.corpus_digest([str(tmp_path / "x")]) == model.corpus_digest([str(tmp_path / "y")])
    assert model.corpus_digest([str(tmp_path / "x")]) != model.corpus_digest([str(tmp_path / "x")] * 2)


@pytest.mark.parametrize("size, heads, layers", [("tiny", 2, 2), ("medium", 8, 8)])
def test_config_keeps_head_dim_64_for_vllm_cpu(size, heads, layers):
    cfg = model.model_config(size, 2048, 0, 0)
    assert cfg["head_dim"] == 64 and cfg["num_attention_heads"] == heads == cfg["num_key_value_heads"]
    assert cfg["hidden_size"] == heads * 64 and cfg["num_hidden_layers"] == layers


def test_unknown_size_is_refused():
    with pytest.raises(model.ModelError, match="tiny, medium"):
        model.model_config("huge", 2048, 0, 0)


def test_cli_without_torch_names_the_interpreter_to_use(tmp_path, capsys):
    rc = model.run_build("tiny", str(tmp_path / "m"), python=str(tmp_path / "no-python"))
    assert rc == 2
    assert "--python" in capsys.readouterr().err


def test_register_adds_model_build():
    parser = argparse.ArgumentParser()
    model.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["model", "build", "tiny", "/tmp/m", "--python", "/usr/bin/python3"])
    assert (args.size, args.out_dir, args.python, args.func) == ("tiny", "/tmp/m", "/usr/bin/python3", model._cmd_build)


def test_runs_as_a_standalone_script():
    out = subprocess.run([sys.executable, model.__file__, "--help"], capture_output=True, text=True, check=True)
    assert "tiny" in out.stdout
