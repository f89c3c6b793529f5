"""The docs: generated pages up to date with the code, a short README, and no link to a page that is not there."""

from __future__ import annotations

import pathlib
import re

from kvtier import reference

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_generated_pages_are_current():
    assert [str(p.relative_to(ROOT)) for p in reference.stale()] == [], "run `python -m kvtier.reference`"


def test_a_new_health_code_shows_in_the_reference(tmp_path):
    probes = tmp_path / "kvtier" / "probes"
    probes.mkdir(parents=True)
    text = (ROOT / "kvtier/probes/health.py").read_text()
    text += '\n\ndef extra(host):\n    return [check(host, "l3", ERR, "L3_SOMETHING_NEW", "why", "fix")]\n'
    (probes / "health.py").write_text(text)
    for other in reference.HEALTH_SOURCES[1:]:
        (tmp_path / other).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / other).write_text((ROOT / other).read_text())
    codes = reference.health_codes(tmp_path)
    assert codes["L3_SOMETHING_NEW"]["statuses"] == {"ERR"} and codes["L3_SOMETHING_NEW"]["tiers"] == {"l3"}
    assert "L3_SOMETHING_NEW" in reference.health_codes_page(tmp_path)
    assert "L3_SOMETHING_NEW" not in reference.health_codes_page()
    assert codes["L2_DOWN"]["statuses"] == {"ERR"}


def test_the_readme_is_short_and_every_link_leads_somewhere():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    missing = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert missing == []
