"""The monitoring role's Prometheus rules, rendered with its defaults: promtool checks them and runs their unit tests
(tests/fixtures/monitoring/kvtier.rules.test.yml: each alert fires for its fault and stays quiet beside it)."""

import pathlib
import shutil
import subprocess

import jinja2
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "monitoring"


def render_rules(directory: pathlib.Path) -> pathlib.Path:
    """The rules file as the role renders it (Ansible's template: trim_blocks), with the role's defaults."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters["default"] = lambda value, fallback="": fallback if isinstance(value, jinja2.Undefined) else value
    template = env.from_string((ROLE / "templates" / "kvtier.rules.yml.j2").read_text())
    path = directory / "kvtier.rules.yml"
    path.write_text(template.render(**defaults))
    return path


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)


def test_the_rules_are_valid(tmp_path):
    rules = render_rules(tmp_path)
    checked = _promtool("check", "rules", str(rules))
    said = checked.stdout + checked.stderr
    assert checked.returncode == 0 and "SUCCESS: 19 rules found" in said and "inconsistency" not in said, said


def test_each_alert_fires_for_its_fault_and_not_beside_it(tmp_path):
    render_rules(tmp_path)
    shutil.copy(REPO / "tests" / "fixtures" / "monitoring" / "kvtier.rules.test.yml", tmp_path)
    tested = _promtool("test", "rules", str(tmp_path / "kvtier.rules.test.yml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_test(tmp_path):
    rules = yaml.safe_load(render_rules(tmp_path).read_text())
    alerts = {r["alert"] for group in rules["groups"] for r in group["rules"] if "alert" in r}
    tests = yaml.safe_load((REPO / "tests" / "fixtures" / "monitoring" / "kvtier.rules.test.yml").read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    assert alerts == tested
