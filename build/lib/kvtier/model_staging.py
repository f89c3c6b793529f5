"""Stage a model for the serving nodes: fetch it once, check every file against its source, write SHA256SUMS.

A source is a local directory (what an operator already has, or a model built with `kvtier model build`) or
the Hugging Face Hub at a pinned commit. Either way the staged directory ends up with ``SHA256SUMS``
(`sha256sum -c` format), and the vllm_lmcache role checks it on every node after copying, so a truncated
copy or a file changed later is found before vLLM loads it. From the Hub each file is checked against the
checksum the Hub publishes for that commit: the SHA-256 of an LFS/Xet file, the git blob id of the others.

The Hub is reached through its own client, `huggingface_hub` (in every serving venv, as vLLM needs it; on a
controller `pip install huggingface_hub`). Tests use a local directory; the Hub path is the same code behind
`HubSource`. This file imports nothing from kvtier, so the role also runs it on a node as a plain script:

    python model_staging.py --hub Qwen/Qwen3-8B --revision <40-hex commit> /opt/kvtier/models/qwen3-8b
    python model_staging.py --from /srv/models/qwen3-8b /opt/kvtier/models/qwen3-8b

The token comes from standard input (``--token-stdin``: what the role uses, so it is in no process's command line or
environment) or from the environment variable named by ``--token-env`` (HF_TOKEN by default), never argv.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time

SUMS = "SHA256SUMS"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_CHUNK = 1 << 20


class StagingError(Exception):
    """The model could not be staged or does not match its source; the message says what to do."""


def _digest(path: str, algorithm: str, prefix: bytes = b"") -> str:
    h = hashlib.new(algorithm)
    h.update(prefix)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def sha256_file(path: str) -> str:
    return _digest(path, "sha256")


def git_blob_sha1(path: str) -> str:
    """The git blob id of a file (what the Hub lists for a file kept in git rather than LFS/Xet)."""
    return _digest(path, "sha1", b"blob %d\0" % os.path.getsize(path))


def model_files(directory: str) -> list:
    """Every regular file under `directory` (relative, sorted), without SHA256SUMS and hidden directories
    (the Hub client's .cache/huggingface bookkeeping)."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), directory)
            if rel != SUMS and os.path.isfile(os.path.join(root, name)):
                found.append(rel)
    return sorted(found)


def sums(directory: str) -> dict:
    """{relative path: sha256} of every model file."""
    return {rel: sha256_file(os.path.join(directory, rel)) for rel in model_files(directory)}


def write_sums(directory: str, digests: dict) -> str:
    path = os.path.join(directory, SUMS)
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(f"{digest}  {rel}\n" for rel, digest in sorted(digests.items()))
    return path


def read_sums(directory: str) -> dict:
    path = os.path.join(directory, SUMS)
    result = {}
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            digest, sep, rel = line.rstrip("\n").partition("  ")
            if not sep or not re.fullmatch(r"[0-9a-f]{64}", digest) or not rel:
                raise StagingError(f"{path}:{number}: not a sha256sum line: {line.strip()!r}")
            result[rel] = digest
    return result


def differences(directory: str, expected: dict, digest=sha256_file) -> list:
    """What differs between the files under `directory` and `expected` ({rel: digest}): missing, changed, extra."""
    have = set(model_files(directory))
    problems = [f"{rel}: missing" for rel in sorted(set(expected) - have)]
    problems += [
        f"{rel}: content differs from its checksum"
        for rel in sorted(set(expected) & have)
        if digest(os.path.join(directory, rel)) != expected[rel]
    ]
    problems += [f"{rel}: not part of the model" for rel in sorted(have - set(expected))]
    return problems


class LocalSource:
    """A model directory on this machine; its own SHA256SUMS, if it has one, is what the copy must match."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)

    def describe(self) -> str:
        return self.path

    def fetch(self, dest: str) -> dict:
        if not os.path.isfile(os.path.join(self.path, "config.json")):
            raise StagingError(f"{self.path} is not a model directory (no config.json)")
        expected = read_sums(self.path) if os.path.isfile(os.path.join(self.path, SUMS)) else sums(self.path)
        for rel in model_files(self.path):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(os.path.join(self.path, rel), os.path.join(dest, rel))
        problems = differences(dest, expected)
        if problems:
            raise StagingError(f"the copy of {self.path} does not match it: " + "; ".join(problems))
        return expected


class HubSource:
    """A model repository on the Hugging Face Hub at one commit.

    `api` and `download` default to huggingface_hub's HfApi().model_info and snapshot_download; they are
    parameters so the checks can run against recorded Hub metadata where the Hub cannot be reached.
    """

    def __init__(self, repo: str, revision: str, token: str | None = None, api=None, download=None):
        if not _COMMIT.match(revision or ""):
            raise StagingError(
                f"--revision {revision!r} for {repo} is not a commit: pin the 40-hex commit id (the Hub shows it "
                f"on the model's 'Files and versions' page), so every node gets the same weights"
            )
        self.repo, self.revision, self.token = repo, revision, token
        self._api, self._download = api, download

    def describe(self) -> str:
        return f"hf://{self.repo}@{self.revision}"

    def _client(self):
        if self._api is not None and self._download is not None:
            return self._api, self._download
        try:
            import huggingface_hub
        except ImportError:
            raise StagingError(
                "the Hugging Face Hub client is not installed here: `pip install huggingface_hub`, or stage on the "
                "nodes (vllm_lmcache_model_hub), whose serving venv has it"
            ) from None
        return huggingface_hub.HfApi().model_info, huggingface_hub.snapshot_download

    def published(self) -> dict:
        """{file: (algorithm, digest)} as the Hub lists them for the commit."""
        model_info, _ = self._client()
        info = model_info(self.repo, revision=self.revision, files_metadata=True, token=self.token)
        if getattr(info, "sha", self.revision) != self.revision:
            raise StagingError(f"the Hub answered for commit {info.sha}, not {self.revision}")
        listed = {}
        for sibling in info.siblings or []:
            lfs = getattr(sibling, "lfs", None)
            sha256 = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
            if sha256:
                listed[sibling.rfilename] = ("sha256", sha256)
            elif getattr(sibling, "blob_id", None):
                listed[sibling.rfilename] = ("sha1-blob", sibling.blob_id)
            else:
                raise StagingError(f"the Hub lists no checksum for {sibling.rfilename} in {self.describe()}")
        return listed

    def fetch(self, dest: str) -> dict:
        listed = self.published()
        _, download = self._client()
        download(self.repo, revision=self.revision, local_dir=dest, token=self.token)
        problems = [f"{rel}: missing" for rel in sorted(set(listed) - set(model_files(dest)))]
        for rel, (algorithm, want) in sorted(listed.items()):
            path = os.path.join(dest, rel)
            if os.path.isfile(path):
                got = sha256_file(path) if algorithm == "sha256" else git_blob_sha1(path)
                if got != want:
                    problems.append(f"{rel}: {algorithm} {got} but the Hub publishes {want}")
        if problems:
            raise StagingError(f"{self.describe()} did not download intact: " + "; ".join(problems))
        return {rel: sha256_file(os.path.join(dest, rel)) for rel in listed}


def stage(source, dest: str) -> dict:
    """Fetch `source` into `dest` (made whole in a sibling directory, then moved in place), write SHA256SUMS.
    An existing `dest` whose SHA256SUMS still matches its files is left as it is."""
    started = time.monotonic()
    dest = os.path.abspath(dest)
    if os.path.isfile(os.path.join(dest, SUMS)) and not differences(dest, read_sums(dest)):
        digests = read_sums(dest)
        return _report(source, dest, digests, started, changed=False)
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".staging-", dir=parent)
    try:
        digests = source.fetch(work)
        write_sums(work, digests)
        _readable(work)
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.rename(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return _report(source, dest, digests, started, changed=True)


def _readable(directory: str) -> None:
    """Directories 0755, files 0644: the serving user reads the model (downloads and mkdtemp are private)."""
    os.chmod(directory, 0o755)
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


def _report(source, dest, digests, started, changed) -> dict:
    return {
        "source": source.describe(),
        "dest": dest,
        "files": len(digests),
        "bytes": sum(os.path.getsize(os.path.join(dest, rel)) for rel in digests),
        "changed": changed,
        "seconds": round(time.monotonic() - started, 2),
    }


def _token(args, stdin=None) -> str | None:
    if args.token_stdin:
        return (stdin or sys.stdin).readline().strip() or None
    return os.environ.get(args.token_env) or None


def _source(args, stdin=None):
    if args.hub:
        return HubSource(args.hub, args.revision, _token(args, stdin))
    return LocalSource(args.source)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--from", dest="source", metavar="DIR", help="a model directory on this machine")
    where.add_argument("--hub", metavar="REPO", help="a Hugging Face Hub model repository, e.g. Qwen/Qwen3-8B")
    parser.add_argument("--revision", help="with --hub: the commit to stage (40 hex digits)")
    parser.add_argument(
        "--token-env", default="HF_TOKEN", help="environment variable holding the Hub token (default HF_TOKEN)"
    )
    parser.add_argument(
        "--token-stdin", action="store_true", help="read the Hub token from the first line of standard input instead"
    )
    parser.add_argument("dest", help="the staged model directory (SHA256SUMS is written into it)")


def register(model_subparsers) -> None:
    """Add ``model stage`` to the kvtier CLI's ``model`` command."""
    parser = model_subparsers.add_parser(
        "stage", help="stage a model for the nodes (a local directory or the Hub at a commit), checked, with SHA256SUMS"
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.hub and not args.revision:
        print("error: --hub needs --revision (a 40-hex commit)", file=sys.stderr)
        return 2
    try:
        report = stage(_source(args), args.dest)
    except (StagingError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report))
    return 0


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description="stage a model: fetch, check every file, write SHA256SUMS")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
