"""No secret on a command line: a value in a task's `environment:` or in a command's argv sits on the (become)
command line, in `ps` and in sudo's journal, where no_log does not reach. Every variable a role's argument spec marks
no_log must reach a node some other way (standard input, a 0600 file)."""

import pathlib

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
COMMANDS = ("ansible.builtin.command", "ansible.builtin.shell", "ansible.builtin.raw", "ansible.builtin.script")


def _secret_names() -> set:
    """Variables with an option marked no_log in any role's argument spec (a nested option: its top variable)."""
    names = set()

    def walk(options: dict, top: str | None) -> None:
        for name, option in (options or {}).items():
            if option.get("no_log"):
                names.add(top or name)
            walk(option.get("options"), top or name)

    for spec in REPO.glob("roles/*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values():
            walk(entry.get("options"), None)
    return names


def _command_lines(node):
    """The text of every `environment:` and every command module's arguments in a YAML document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "environment":
                yield yaml.safe_dump(value)
            elif key in COMMANDS:  # its standard input is not on the command line
                shown = {k: v for k, v in value.items() if k != "stdin"} if isinstance(value, dict) else value
                yield yaml.safe_dump(shown)
            yield from _command_lines(value)
    elif isinstance(node, list):
        for item in node:
            yield from _command_lines(item)


def _task_files():
    for pattern in ("roles/*/tasks/**/*.yml", "roles/*/handlers/*.yml", "playbooks/**/*.yml"):
        yield from REPO.glob(pattern)


def test_argument_specs_mark_the_secrets():
    assert {"kv_store_lmcache_password", "kv_store_admin_password", "vllm_lmcache_api_key", "router_tenants"} <= (
        _secret_names()
    )


def test_no_secret_variable_reaches_an_environment_or_a_command_line():
    secrets = _secret_names()
    found = [
        f"{path.relative_to(REPO)}: {name}"
        for path in _task_files()
        for text in _command_lines(yaml.safe_load(path.read_text()))
        for name in secrets
        if name in text
    ]
    assert found == []


def test_the_check_sees_a_secret_in_an_environment():
    task = [
        {
            "ansible.builtin.command": {"argv": ["valkey-cli"], "stdin": "AUTH {{ kv_store_lmcache_password }}"},
            "environment": {"REDISCLI_AUTH": "{{ kv_store_admin_password }}"},
        }
    ]
    seen = "".join(_command_lines(task))
    assert "kv_store_admin_password" in seen and "kv_store_lmcache_password" not in seen
