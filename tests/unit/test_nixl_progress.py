"""The venv hook that lets NIXL's progress thread sleep: it sets pthrDelay on the agents LMCache creates,
only where the LMCache server's unit asks for it, and leaves every other process alone."""

import os
import pathlib
import subprocess
import sys
import textwrap

ROLE_FILES = pathlib.Path(__file__).resolve().parents[2] / "roles" / "vllm_lmcache" / "files"

# A stand-in for a NIXL build: the same module layout and the same agent construction as nixl 1.5.1's
# _api.py (a config object whose pthrDelay is set to 0, then nixlBind.nixlAgent(name, config)).
FAKE_BINDINGS = (
    "class nixlAgentConfig:\n    pthrDelay = None\n\n"
    "def nixlAgent(name, config):\n    return (name, config.pthrDelay)\n"
)
FAKE_API = textwrap.dedent("""
    from . import _bindings as nixlBind
    def make_agent(name):
        config = nixlBind.nixlAgentConfig()
        config.pthrDelay = 0
        return nixlBind.nixlAgent(name, config)
""")


def run_with_hook(tmp_path, env_value):
    site = tmp_path / f"site-{env_value}"
    (site / "nixl_cu12").mkdir(parents=True)
    (site / "nixl_cu12" / "__init__.py").write_text("")
    (site / "nixl_cu12" / "_bindings.py").write_text(FAKE_BINDINGS)
    (site / "nixl_cu12" / "_api.py").write_text(FAKE_API)
    for name in ("kvtier_nixl_progress.py", "kvtier-nixl-progress.pth"):
        (site / name).write_text((ROLE_FILES / name).read_text())
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_NIXL_PROGRESS_DELAY_US"}
    if env_value is not None:
        env["KVTIER_NIXL_PROGRESS_DELAY_US"] = env_value
    # site.addsitedir processes the .pth file as the venv's site-packages would at interpreter start.
    code = (
        f"import site; site.addsitedir({str(site)!r})\n"
        "import nixl_cu12._api as api\nprint(api.make_agent('A')[1], api.make_agent('B')[1])"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.split()


def test_the_lmcache_servers_agents_get_the_delay(tmp_path):
    assert run_with_hook(tmp_path, "10000") == ["10000", "10000"]


def test_other_processes_keep_nixls_own_setting(tmp_path):
    assert run_with_hook(tmp_path, None) == ["0", "0"]
    assert run_with_hook(tmp_path, "0") == ["0", "0"]
