"""`kvtier warmup -i <inventory> (--corpus FILE | --lengths N,N ...)`: fill the cache tiers after maintenance.

The same probe code as the ``kvtier_warmup`` module (kvtier/probes/warmup.py), run on each Spark against its
own vLLM, in batches so a long corpus shows its progress. A corpus is JSON lines: ``{"prompt": "text"}`` or
``{"tokens": 1024, "id": "doc-7"}`` (a document of exactly that many tokens, generated on the node).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from kvtier import exits
from kvtier.nodes.scripts import script
from kvtier.nodes.target import Target
from kvtier.nodes.transport import NodeError
from kvtier.probes import lmcache as lmcache_probe
from kvtier.probes import warmup as warmup_probe

SOURCE = script(lmcache_probe, warmup_probe)
TEXT = "/usr/share/common-licenses/GPL-3"  # on every Debian and Ubuntu host
NAME = "kvtier warmup"


class WarmupError(Exception):
    pass


def load_corpus(path: str) -> list:
    """The entries of a JSON-lines corpus file (blank lines and lines starting with # are skipped)."""
    entries = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                entries.append(json.loads(line))
            except ValueError as exc:
                raise WarmupError(f"{path} line {number} is not JSON: {exc}") from None
    return entries


class Warmup:
    """Warm one Spark's tiers with a corpus, as the module does, printing progress between batches."""

    def __init__(self, target: Target, out=print, concurrency: int = 4, store_timeout: float = 120.0):
        self.t, self.out = target, out
        self.concurrency, self.store_timeout = concurrency, store_timeout

    def _call(self, host: str, expression: str, timeout: float = 900):
        try:
            return self.t.nodes[host].python(SOURCE, expression, timeout=timeout)
        except (NodeError, ValueError) as exc:
            raise WarmupError(f"{host}: {exc}") from None

    def counters_expr(self, host: str) -> str:
        return f"lmcache_summary(get_metrics({self.t.lmcache_url(host) + '/metrics'!r}))"

    def prompts(self, host: str, entries: list, name: str = NAME) -> list:
        call = f"corpus_prompts({self.t.vllm_url(host)!r}, {self.t.model!r}, {entries!r}, {TEXT!r}, {name!r})"
        return self._call(host, call)

    def send(self, host: str, prompts: list, label: str) -> list:
        """Every prompt through the node's vLLM, a batch per node call; a progress line after each batch."""
        replies, batch, began = [], max(self.concurrency * 4, 1), time.monotonic()
        for start in range(0, len(prompts), batch):
            chunk = prompts[start : start + batch]
            url, model = self.t.vllm_url(host), self.t.model
            call = f"send_all({url!r}, {model!r}, {chunk!r}, {self.concurrency}, api_key=node_api_key())"
            replies += self._call(host, call)
            if len(prompts) > batch:
                ttft = warmup_probe.stats(r["ttft"] for r in replies)
                self.out(
                    f"  {host} {label}: {len(replies)}/{len(prompts)} prompts in {time.monotonic() - began:.0f} s, "
                    f"TTFT p50 {ttft['p50'] or 0:.3f} s"
                )
        return replies

    def run(self, host: str, entries: list, replay: bool = True, name: str = NAME) -> dict:
        spec = self.t.spec
        problems = warmup_probe.corpus_problems(entries, spec.model.max_model_len)
        if problems:
            raise WarmupError("the warmup corpus is not usable: " + "; ".join(problems))
        chunk = spec.lmcache.chunk_size
        persistent = [a for a in (self.t.l2_name, self.t.l3_name) if a]
        prompts = self.prompts(host, entries, name)
        before = self._call(host, self.counters_expr(host))
        began = time.monotonic()
        first = self.send(host, prompts, "warming")
        seconds = time.monotonic() - began
        expected = warmup_probe.new_chunks(first, chunk)
        stored = self._call(
            host,
            f"wait_stored(lambda: {self.counters_expr(host)}, {before!r}, {persistent!r}, {expected}, "
            f"{self.store_timeout})",
        )
        again = self.send(host, prompts, "replay") if replay else None
        return warmup_probe.report(first, before, stored, chunk, seconds, again)


def table(results: dict) -> list:
    """One block per Spark: what was sent, stored per tier, and what the replay hit."""
    lines = []
    for host, r in results.items():
        stored = r["stored"]
        tiers = ", ".join(
            f"{name} {v['stores']} store(s) {v['bytes'] / 2**20:.1f} MiB"
            for name, v in stored.items()
            if isinstance(v, dict)
        )
        lines.append(
            f"{host}: {r['prompts']} prompts, {r['prompt_tokens']} tokens ({r['new_prompts']} new, "
            f"{r['tokens_stored']} tokens stored), {r['failed']} failed, {r['seconds']:.1f} s, "
            f"TTFT p50 {r['ttft']['p50']} s p95 {r['ttft']['p95']} s"
        )
        lines.append(
            f"  stored: L0 DRAM {stored['l0_chunks']} chunk(s) {stored['l0_bytes'] / 2**20:.1f} MiB; {tiers or 'none'}"
            + (f"; LATE: {', '.join(r['stores_late'])}" if r["stores_late"] else "")
            + (f"; UNFINISHED: {'; '.join(r['stores_pending'])}" if r.get("stores_pending") else "")
        )
        if "replay" in r:
            rp = r["replay"]
            share = rp["hit_tokens"] / rp["cacheable_tokens"] * 100 if rp["cacheable_tokens"] else 0.0
            lines.append(
                f"  replay: {rp['hit_tokens']} of {rp['cacheable_tokens']} cacheable tokens hit ({share:.0f} %), "
                f"{rp['failed']} failed, TTFT p50 {rp['ttft']['p50']} s p95 {rp['ttft']['p95']} s"
            )
        lines.append(f"  {'changed: new entries stored' if r['changed'] else 'ok: already warm'}")
    return lines


def _cmd(args: argparse.Namespace) -> int:
    from kvtier.inventory import Inventory, InventoryError
    from kvtier.nodes.target import TargetError, from_inventory

    log = (lambda line: print(line, file=sys.stderr)) if args.json else print
    try:
        entries = (load_corpus(args.corpus) if args.corpus else []) + warmup_probe.length_entries(
            args.lengths or [], args.repeat
        )
        target = from_inventory(Inventory(exits.inventory(args.inventory), args.vault_password_file))
        hosts = args.host or list(target.nodes)
        unknown = [h for h in hosts if h not in target.nodes]
        if unknown:
            raise WarmupError(f"not Sparks of this inventory: {', '.join(unknown)}")
        warmup = Warmup(target, log, args.concurrency, args.store_timeout)
        results = {h: warmup.run(h, entries, replay=not args.no_replay) for h in hosts}
    except (OSError, WarmupError, InventoryError, TargetError, exits.NoInventory) as exc:
        print(f"kvtier warmup: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    print(json.dumps(results, indent=2) if args.json else "\n".join(table(results)))
    found = [f"{h}: {line}" for h, r in results.items() for line in warmup_probe.problems(r, args.store_timeout)]
    for line in found:
        print(f"kvtier warmup: {line}", file=sys.stderr)
    return 1 if found else 0


def _lengths(text: str) -> list:
    try:
        return [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of token lengths: {text!r}") from None


def register(sub) -> None:
    parser = sub.add_parser(
        "warmup",
        help="fill the cache tiers from a prompt corpus and show the replay hits",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    exits.add_inventory_argument(parser)
    parser.add_argument("--corpus", help="JSON lines: {'prompt': text} or {'tokens': N, 'id': name}")
    parser.add_argument("--lengths", type=_lengths, help="documents of these token lengths, e.g. 512,1024,1536")
    parser.add_argument("--repeat", type=int, default=1, help="documents per length (default 1)")
    parser.add_argument("--host", action="append", help="a Spark to warm (repeat; default: every Spark)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight per Spark (default 4)")
    parser.add_argument("--store-timeout", type=float, default=120.0, help="seconds to wait for the stores")
    parser.add_argument("--no-replay", action="store_true", help="skip the replay that counts the hits")
    parser.add_argument("--vault-password-file", help="for vaulted inventory values")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (progress goes to stderr)")
    parser.set_defaults(func=_cmd)
