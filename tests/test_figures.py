"""`python -m prototype figures` at smoke size, into a temporary folder: the command the README
names regenerates every committed figure; and the figures the docs embed are committed."""

from __future__ import annotations

import json
import re

import pytest

from prototype.__main__ import main as cli_main
from prototype.cli import figures
from tests.conftest import REPO

PNG = b"\x89PNG\r\n\x1a\n"
EMBEDS = {"README.md": "docs/figures/", "docs/notebooks.md": "figures/"}


def embedded_images(page: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (REPO / page).read_text())


@pytest.mark.parametrize("page", sorted(EMBEDS))
def test_every_embedded_figure_is_committed_under_docs_figures(page):
    images = embedded_images(page)
    assert images, f"{page} embeds no figure"
    for image in images:
        assert image.startswith(EMBEDS[page]), f"{page} embeds {image} from outside docs/figures/"
        path = (REPO / page).parent / image
        assert path.read_bytes()[:8] == PNG, image
        assert path.stat().st_size < 400_000, f"{image} is not small"
        assert path.name in ("compare.png", *figures.NOTEBOOK_PICTURES)  # so the command regenerates it


@pytest.mark.slow
def test_the_figures_command_regenerates_every_figure_at_smoke_size(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path / "results"))
    readme = (REPO / "README.md").read_text()
    assert cli_main(["figures", "--smoke", "--out", str(tmp_path / "figures")]) == 0
    written = sorted(p.name for p in (tmp_path / "figures").iterdir())
    data = ["compare.json", "published.json", "notebook_latency_sweeps.json"]  # the numbers behind the figures
    assert written == sorted(["compare.png", *figures.NOTEBOOK_PICTURES, *data])
    for name in written:
        content = (tmp_path / "figures" / name).read_bytes()
        if name in data:
            section = json.loads(content)
            assert section["name"] == name.removesuffix(".json") and section["figures"], name
        else:
            assert content[:8] == PNG and 10_000 < len(content) < 400_000, name
    assert (REPO / "README.md").read_text() == readme  # a smoke run's numbers are not quoted
