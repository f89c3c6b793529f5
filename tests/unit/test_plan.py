"""The capacity planner: model-config arithmetic, the memory budget, tier figures and the command."""

import json

import pytest

from kvtier import cli
from kvtier.cluster import memory
from kvtier.plan import hardware, model, report, tiers
from kvtier.plan.model import PlanError

GIB = 1 << 30


def test_shipped_qwen3_geometry():
    q8 = model.load("Qwen/Qwen3-8B")
    assert q8.bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456  # 144 KiB
    assert q8.chunk_bytes(256) == 36 * 2**20
    assert q8.parameters == 8_190_427_136 and round(q8.weights_gib, 2) == 15.26
    q17 = model.load("qwen3-1.7b")
    assert q17.bytes_per_token == 114_688 and q17.chunk_bytes(256) == 28 * 2**20
    assert q17.parameters == 1_720_451_072  # tied embeddings are counted once


def test_fp8_kv_halves_every_figure():
    assert model.load("Qwen3-8B", "fp8").bytes_per_token == 147_456 // 2


def test_a_config_file_or_its_directory(tmp_path):
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "torch_dtype": "float16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    kv = model.load(str(tmp_path))
    # No num_key_value_heads: multi-head attention; no head_dim: hidden_size / heads.
    assert (kv.kv_heads, kv.head_dim, kv.bytes_per_token) == (4, 16, 2 * 2 * 4 * 16 * 2)
    assert kv.parameters is None  # no vocab or intermediate size: the weights must be given


def test_mla_caches_one_latent_per_layer():
    config = {
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "hidden_size": 7168,
        "torch_dtype": "bfloat16",
        "n_routed_experts": 256,
    }
    kv = model.from_config(config, "deepseek-v3")
    assert kv.bytes_per_token == 61 * (512 + 64) * 2
    assert kv.parameters is None  # mixture of experts: not counted, --weights-gib is asked for


@pytest.mark.parametrize(
    "extra, reason",
    [
        ({"layer_types": ["full_attention", "sliding_attention"]}, "not all full attention"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"num_kv_shared_layers": 10}, "shares KV across layers"),
        ({"hybrid_override_pattern": "M-M*"}, "state-space or linear layers"),
    ],
)
def test_models_whose_cache_differs_per_layer_are_refused(extra, reason):
    config = {"num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 64, **extra}
    with pytest.raises(PlanError, match=reason):
        model.from_config(config, "m")


def test_unknown_model_lists_the_shipped_ones():
    with pytest.raises(PlanError, match="Qwen3-1.7B, Qwen3-8B"):
        model.load("Llama-9000")


def test_budget_flags_leave_room_for_lmcache_and_the_os():
    budget = memory.Budget(119, 15.3, 40, 32, 4, 8)
    # vLLM checks that utilization x total is free at start; LMCache's DRAM and the OS are taken by then.
    assert budget.gpu_memory_utilization == 0.66
    assert budget.gpu_memory_utilization * 119 >= budget.vllm_gib
    assert budget.kv_cache_memory_bytes == 40 * GIB and budget.problems("spark01") == []


def test_budget_problems_say_by_how_much():
    over = memory.Budget(119, 15.3, 80, 32, 4, 8)
    assert over.problems("spark01") == [
        "spark01: memory over budget: model.weights_gib 15.3 + vllm.gpu_kv_cache_gib 80 + lmcache.l0_dram_gib 32 + "
        "memory.runtime_overhead_gib 4 + memory.os_reserve_gib 8 = 139.3 GiB, more than its 119 GiB of unified memory; "
        "lower lmcache.l0_dram_gib or vllm.gpu_kv_cache_gib by 20.3 GiB in total"
    ]
    # Fits in total, but rounding the share down to 0.01 leaves vLLM short.
    tight = memory.Budget(100, 10, 45.5, 40, 4.4, 0.1)
    assert tight.gpu_memory_utilization == 0.59 and "lower vllm.gpu_kv_cache_gib by 0.90 GiB" in tight.problems("s")[0]


def test_largest_gpu_kv_cache_fits_exactly():
    largest = memory.largest_gpu_kv_cache_gib(119, 15.3, 32, 4, 8)
    assert memory.Budget(119, 15.3, largest, 32, 4, 8).problems("s") == []
    assert memory.Budget(119, 15.3, largest + 0.1, 32, 4, 8).problems("s") != []


def test_tier_figures_for_the_example_cluster():
    kv, hw = model.load("Qwen3-8B"), hardware.load(prefill_tokens_per_s=3000)
    budget = memory.Budget(119, kv.weights_gib, 40, 32, 4, 8)
    by_tier = {t.tier: t for t in tiers.tiers(kv, hw, budget, 256)}
    assert by_tier["l0"].tokens(kv) == 32 * GIB // 147_456
    assert by_tier["l1_p2p"].capacity_bytes == 3 * 32 * GIB  # the other three Sparks' DRAM
    # 8 x 7 GB/s of drives behind a 100GbE link: the link (at 90 %) is the limit.
    assert by_tier["l3"].load_gbs == pytest.approx(12.5 * 0.9)
    assert by_tier["l3"].capacity_bytes == pytest.approx(8 * 15.36e12 * 0.9)
    # 36 MiB objects are past LMCache's 4 MB sweet spot for Redis/Valkey GETs.
    assert by_tier["l2"].load_gbs == 1.4
    load = by_tier["l3"].load_s(kv, 32768)
    assert load == pytest.approx(0.001 + 32768 * 147_456 / 11.25e9)
    even = by_tier["l3"].break_even_tokens(kv, 3000)
    assert by_tier["l3"].load_s(kv, even) < even / 3000 and by_tier["l3"].load_s(kv, even - 1) >= (even - 1) / 3000


def test_a_tier_slower_than_recompute_never_breaks_even():
    kv = model.load("Qwen3-8B")
    slow = tiers.Tier("l2", "L2", GIB, 0.1, 0.001, "test")
    assert slow.break_even_tokens(kv, 3000) is None


def test_hardware_file_and_bad_values(tmp_path):
    path = tmp_path / "hw.yml"
    path.write_text("drive: D7-PS1010\ndrives: 4\nnic_gbit: 200\n")
    hw = hardware.load(str(path), sparks=2)
    assert (hw.drive.read_gbs, hw.drives, hw.nic_gbs, hw.sparks) == (14.5, 4, 25.0, 2)
    path.write_text("nic_gbits: 200\n")
    with pytest.raises(PlanError, match="unknown hardware setting.*nic_gbits"):
        hardware.load(str(path))
    with pytest.raises(PlanError, match="rdma_efficiency 1.5 is out of range"):
        hardware.load(rdma_efficiency=1.5)
    with pytest.raises(PlanError, match="unknown drive 'P9999'"):
        hardware.load(drive="P9999")


def test_report_json_has_every_tier_and_the_flags():
    kv, hw = model.load("Qwen3-8B"), hardware.load()
    plan = report.build(kv, hw, memory.Budget(119, kv.weights_gib, 40, 32, 4, 8), 256, (1024, 32768))
    assert [t["tier"] for t in plan["tiers"]] == ["l0", "l1_p2p", "l2", "l3"]
    assert plan["memory"]["vllm_flags"] == {"--kv-cache-memory-bytes": 40 * GIB, "--gpu-memory-utilization": 0.66}
    assert plan["prefill_basis"].startswith("estimated") and "prefill" in plan["sources"]
    assert all(len(t["contexts"]) == 2 for t in plan["tiers"])
    text = report.text(plan)
    assert "L3 NVMe pool" in text and "--gpu-memory-utilization 0.66" in text


def test_the_command(capsys):
    assert cli.main(["plan", "--model", "Qwen3-8B", "--json", "--context", "8192"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["model"]["bytes_per_chunk"] == 36 * 2**20 and plan["tiers"][0]["contexts"][0]["tokens"] == 8192
    # Over budget: the plan is printed with the problem, and the exit status says so.
    assert cli.main(["plan", "--model", "Qwen3-8B", "--gpu-kv-gib", "90"]) == 1
    assert "PROBLEM: each Spark: memory over budget" in capsys.readouterr().out
    assert cli.main(["plan", "--model", "nope"]) == 2


def test_l3_keeps_an_unread_chunk_for_its_low_watermark_over_the_store_rate(capsys):
    kv = model.load("Qwen3-8B")
    hw = hardware.load(None)
    plan = report.build(kv, hw, memory.Budget(119, kv.weights_gib, 40, 32, 4, 8), 256, (1024,), l3_store_gbs=2.0)
    l3 = next(r for r in plan["tiers"] if r["tier"] == "l3")
    kept = plan["l3_retention"]
    assert kept["seconds"] == pytest.approx(report.L3_LOW_WATERMARK * l3["capacity_gib"] * 2**30 / 2e9)
    # Without a rate: every Spark storing what it prefills, the fastest the pool can turn.
    worst = report.build(kv, hw, memory.Budget(119, kv.weights_gib, 40, 32, 4, 8), 256, (1024,))["l3_retention"]
    assert worst["store_gbs"] == pytest.approx(hw.sparks * plan["prefill_tokens_per_s"] * kv.bytes_per_token / 1e9)
    assert "L3 keeps a chunk nobody reads again for" in report.text(plan)
    assert cli.main(["plan", "--model", "Qwen3-8B", "--l3-store-gbs", "0"]) == 2
    assert "--l3-store-gbs must be a positive rate" in capsys.readouterr().err


def test_more_storage_nodes_move_the_shared_ceilings_not_one_sparks():
    """Twelve Sparks loading at once share one storage node's link; three nodes triple the storage side, while one
    Spark alone still loads at most what its own link and LMCache's client give."""
    kv = model.load("Qwen3-8B")
    one, three = hardware.load(sparks=12), hardware.load(sparks=12, storage_nodes=3)
    by_tier = {t.tier: t for t in tiers.tiers(kv, three, memory.Budget(119, kv.weights_gib, 40, 32, 4, 8), 256)}
    assert by_tier["l2"].capacity_bytes == 3 * 128 * GIB
    assert by_tier["l3"].capacity_bytes == pytest.approx(3 * 8 * 15.36e12 * 0.9)
    assert by_tier["l3"].load_gbs == pytest.approx(12.5 * 0.9)  # one Spark: its link, however many nodes
    shared_one = {s.tier: s for s in tiers.shared(kv, one, 256, 1)}
    shared_three = {s.tier: s for s in tiers.shared(kv, three, 256, 3)}
    assert shared_one["l3"].total_gbs == pytest.approx(12.5 * 0.9)
    assert shared_one["l3"].per_spark_gbs == pytest.approx(12.5 * 0.9 / 12)
    assert shared_three["l3"].per_spark_gbs == pytest.approx(3 * 12.5 * 0.9 / 12)
    # L2: three links' worth in all, but each Spark is held to LMCache's GET rate for 36 MiB chunks.
    assert shared_three["l2"].total_gbs == pytest.approx(37.5) and shared_three["l2"].per_spark_gbs == 1.4
    plan = report.build(kv, three, memory.Budget(119, kv.weights_gib, 40, 32, 4, 8), 256, (32768,))
    assert [(s["tier"], s["storage_nodes"]) for s in plan["shared"]] == [("l2", 1), ("l2", 3), ("l3", 1), ("l3", 3)]
    text = report.text(plan)
    assert "every Spark (12) loading from one tier at once" in text and "3 storage nodes" in text
    assert cli.main(["plan", "--model", "Qwen3-8B", "--storage-nodes", "0"]) == 2
