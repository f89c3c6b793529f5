"""Image recipes: the cache key changes exactly when the recipe does."""

import dataclasses

from kvtier import images
from kvtier.cli import main


def test_digest_is_stable_and_order_independent():
    a = images.ImageRecipe("localhost/x:1", "bookworm", ("python3", "systemd"))
    b = images.ImageRecipe("localhost/x:1", "bookworm", ("systemd", "python3"))
    assert a.digest == b.digest


def test_digest_changes_with_suite_and_packages():
    base = images.RECIPES["debian12"]
    assert dataclasses.replace(base, suite="trixie").digest != base.digest
    assert dataclasses.replace(base, packages=base.packages + ("vim",)).digest != base.digest


def test_build_skips_an_image_with_the_same_recipe(monkeypatch):
    recipe = images.RECIPES["debian12"]
    monkeypatch.setattr(images, "current_digest", lambda r: r.digest)
    monkeypatch.setattr(images.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("rebuilt")))
    assert images.build(recipe, log=lambda _m: None) is False


def test_cli_rejects_unknown_image(capsys):
    assert main(["images", "build", "debian99"]) == 2
    assert "unknown image(s): debian99" in capsys.readouterr().err
