"""CPU time per systemd service, read from a /proc tree (a recorded layout, then this machine's own)."""

import os

from kvtier.probes import cpu

# /proc/<pid>/cgroup of an LMCache server in a lab Spark container (cgroup v2), and of a process outside.
LMCACHE_CGROUP = "0::/system.slice/kvtier-lmcache.service\n"
NESTED_CGROUP = "0::/machine.slice/libpod-4f2c.scope/system.slice/kvtier-vllm.service/worker\n"
SHELL_CGROUP = "0::/user.slice/user-0.slice/session-3.scope\n"
# utime 1500 and stime 300 ticks; the command name has a space and a parenthesis in it.
STAT = "4242 (lmcache (srv) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 1500 300 0 0 20 0 12 0 100 0 0\n"


def fake_proc(tmp_path, processes):
    for pid, (cgroup, stat) in processes.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(cgroup)
        (tmp_path / str(pid) / "stat").write_text(stat)
    (tmp_path / "self").mkdir()
    return str(tmp_path)


def test_the_unit_is_the_innermost_service_of_the_cgroup_path():
    assert cpu.unit_of(LMCACHE_CGROUP) == "kvtier-lmcache.service"
    assert cpu.unit_of(NESTED_CGROUP) == "kvtier-vllm.service"
    assert cpu.unit_of(SHELL_CGROUP) is None


def test_user_and_system_time_are_read_after_the_command_name():
    assert cpu.cpu_seconds(STAT, ticks=100) == 18.0


def test_time_is_summed_per_unit_of_the_prefix_only(tmp_path):
    proc = fake_proc(
        tmp_path,
        {10: (LMCACHE_CGROUP, STAT), 11: (LMCACHE_CGROUP, STAT), 12: (NESTED_CGROUP, STAT), 13: (SHELL_CGROUP, STAT)},
    )
    ticks = os.sysconf("SC_CLK_TCK")
    assert cpu.service_cpu_seconds("kvtier-", proc) == {
        "kvtier-lmcache.service": 2 * 1800 / ticks,
        "kvtier-vllm.service": 1800 / ticks,
    }


def test_this_machines_proc_is_readable():
    # This machine's /proc parses, and no unit has that prefix.
    assert cpu.service_cpu_seconds("no-such-unit-") == {}
