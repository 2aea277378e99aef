"""One set of headline numbers: every figure README.md and docs/ quote, taken from the data its command wrote.

A command whose figures are quoted (compare, an experiment, a notebook) puts them into the "headline" section of
its results JSON (`section`): each figure an `uncertainty.Estimate` with its format and what it measures, the
tables the docs print, and the data its committed picture is drawn from. `python -m prototype headline RESULTS`
copies that section into docs/figures/<name>.json (`import_results`), the committed data behind the committed
figure of the same name, and rewrites every marked span in README.md and docs/*.md from the data (`update_pages`):

    <!-- fig:compare.gain.chained.1000 -->4.0% [2.1%, 6.3%] n=10<!-- /fig -->

The key's first part names the data file (docs/figures/compare.json), the rest a figure or a table in it. A span
prints the value, its 95% interval and its n; `<!-- fig:KEY interval -->` leaves the n out (a sentence that gave
it already), `<!-- fig:KEY value -->` prints the value alone; a table's key prints a Markdown table. Nothing between
the marks is typed by hand: tests/test_headline.py fails when a span differs from the data, and when the data
differ from a fresh run of the command that wrote them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .uncertainty import Estimate

REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / "docs" / "figures"
SECTION = "headline"
STYLES = ("full", "interval", "value")
SPAN = re.compile(r"<!-- fig:(?P<key>[A-Za-z0-9_.\-]+)(?: (?P<style>[a-z]+))? -->(?P<text>.*?)<!-- /fig -->", re.S)


class HeadlineError(ValueError):
    """A span whose key names no data file or no figure in it, or a results file without a headline section."""


def figure(estimate: Estimate, template: str = "{:.2f}", *, scale: float = 1.0, label: str = "") -> dict[str, Any]:
    """A figure of a headline section: the estimate (in the unit the code uses), how it prints (`template` on the
    value times `scale`: "{:.1f}%" with 100 prints a share as a percentage) and what it measures."""
    return {**estimate.as_dict(), "format": template, "scale": scale, "label": label}


def text(words: str) -> dict[str, Any]:
    """A figure that is a phrase computed by the command (a ranking of drivers, say), printed as it is."""
    return {"text": words}


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """A table of a headline section, each cell already printed (a figure's cell through `render`)."""
    return {"columns": list(columns), "rows": [[str(cell) for cell in row] for row in rows]}


def section(name: str, *, command: str, workload: str, figures: Mapping[str, Mapping[str, Any]],
            tables: Mapping[str, Mapping[str, Any]] | None = None, data: Any = None) -> dict[str, Any]:
    """The headline section of a results JSON, and the content of docs/figures/<name>.json once imported: the
    command and workload that made the figures (printed by the docs beside them), the figures, the tables and the
    data the committed picture is drawn from."""
    if not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
        raise HeadlineError(f"a headline's name is a file name of letters, digits, _ and -: {name!r}")
    return {"name": name, "command": command, "workload": workload, "figures": dict(figures), "tables": dict(tables or {}),
            "data": data}


def estimate_of(entry: Mapping[str, Any]) -> Estimate:
    """The figure's estimate, scaled to the unit it prints in."""
    fields = {k: entry[k] for k in ("value", "low", "high", "n", "of", "method")}
    return Estimate(**{k: _number(v) if k in ("value", "low", "high") else v for k, v in fields.items()}).scaled(entry.get("scale", 1.0))


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def render(entry: Mapping[str, Any], style: str = "full") -> str:
    """A figure as a span prints it: `4.0% [2.1%, 6.3%] n=10` (full), without ` n=10` (interval), `4.0%` (value);
    a table as Markdown."""
    if "columns" in entry:
        return render_table(entry)
    if "text" in entry:
        return entry["text"]
    if style not in STYLES:
        raise HeadlineError(f"unknown span style {style!r} (styles: {', '.join(STYLES)})")
    estimate = estimate_of(entry)
    if style == "value":
        return entry["format"].format(estimate.value)
    return estimate.format(entry["format"], with_n=style == "full")


def render_table(entry: Mapping[str, Any]) -> str:
    """A Markdown table, on lines of its own between the marks."""
    columns = entry["columns"]
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in entry["rows"]]
    return "\n" + "\n".join(lines) + "\n"


# --- the committed data -------------------------------------------------------------------------------------------


def write(path: str | Path, content: Mapping[str, Any]) -> Path:
    """JSON as every results and data file is written: indented, keys in their order, a newline at the end (the
    same content gives the same bytes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=1) + "\n")
    return path


def load(name: str, folder: str | Path = FIGURES) -> dict[str, Any]:
    """docs/figures/<name>.json."""
    path = Path(folder) / f"{name}.json"
    if not path.is_file():
        raise HeadlineError(f"no data file {path}")
    return json.loads(path.read_text())


def headline_of(path: str | Path) -> dict[str, Any]:
    """The headline section of a results JSON."""
    content = json.loads(Path(path).read_text())
    if not isinstance(content, dict) or not isinstance(content.get(SECTION), dict):
        raise HeadlineError(f"{path} has no {SECTION!r} section")
    return content[SECTION]


def results_files(paths: Iterable[str | Path]) -> list[Path]:
    """The results JSON files named, a folder standing for every JSON file in it that has a headline section."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            inside = [p for p in sorted(path.glob("*.json")) if _has_headline(p)]
            if not inside:
                raise HeadlineError(f"no results JSON with a {SECTION!r} section in {path}")
            found += inside
        elif path.is_file():
            found.append(path)
        else:
            raise HeadlineError(f"no such file or folder: {path}")
    return found


def _has_headline(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text()).get(SECTION), dict)
    except (ValueError, AttributeError):
        return False


def import_results(path: str | Path, folder: str | Path = FIGURES) -> Path:
    """Copy a results JSON's headline section into <folder>/<name>.json; returns the data file."""
    content = headline_of(path)
    return write(Path(folder) / f"{content['name']}.json", content)


# --- the marked spans ---------------------------------------------------------------------------------------------


@attrs.frozen
class Span:
    """A marked span of a page: its key, style, the text between its marks and the line it starts on."""

    page: str
    key: str
    style: str
    text: str
    line: int


def spans(text: str, page: str = "") -> list[Span]:
    return [Span(page, m["key"], m["style"] or "full", m["text"], text.count("\n", 0, m.start()) + 1) for m in SPAN.finditer(text)]


def resolver(folder: str | Path = FIGURES) -> Callable[[str, str], str]:
    """`resolve(key, style)`: what a span with that key and style must hold, from the data files in `folder`."""
    loaded: dict[str, dict[str, Any]] = {}

    def resolve(key: str, style: str = "full") -> str:
        name, _, rest = key.partition(".")
        if name not in loaded:
            loaded[name] = load(name, folder)
        data = loaded[name]
        entry = data["figures"].get(rest, data.get("tables", {}).get(rest))
        if entry is None:
            raise HeadlineError(f"docs/figures/{name}.json has no figure or table {rest!r}")
        return render(entry, style)

    return resolve


def rewrite(text: str, resolve: Callable[[str, str], str]) -> str:
    """`text` with every marked span's content replaced by what its key resolves to."""
    return SPAN.sub(lambda m: f"<!-- fig:{m['key']}{' ' + m['style'] if m['style'] else ''} -->{resolve(m['key'], m['style'] or 'full')}"
                    "<!-- /fig -->", text)


def pages(repo: str | Path = REPO) -> list[Path]:
    """Where spans live: README.md and the pages under docs/."""
    repo = Path(repo)
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


@attrs.frozen
class Mismatch:
    span: Span
    expected: str

    def __str__(self) -> str:
        return f"{self.span.page}:{self.span.line}: fig:{self.span.key} shows {self.span.text!r}, the data give {self.expected!r}"


def stale_spans(repo: str | Path = REPO, folder: str | Path = FIGURES) -> list[Mismatch]:
    """Every span whose text differs from what its data give (an unknown key raises HeadlineError)."""
    resolve = resolver(folder)
    found = []
    for page in pages(repo):
        for span in spans(page.read_text(), str(page.relative_to(repo))):
            expected = resolve(span.key, span.style)
            if span.text != expected:
                found.append(Mismatch(span, expected))
    return found


def update_pages(repo: str | Path = REPO, folder: str | Path = FIGURES) -> list[Path]:
    """Rewrite every span of README.md and docs/*.md from the data; returns the pages that changed."""
    resolve = resolver(folder)
    changed = []
    for page in pages(repo):
        text = page.read_text()
        new = rewrite(text, resolve)
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed


__all__ = [
    "FIGURES", "HeadlineError", "Mismatch", "Span", "estimate_of", "figure", "headline_of", "import_results", "load", "pages",
    "render", "render_table", "resolver", "results_files", "rewrite", "section", "spans", "stale_spans", "table", "text",
    "update_pages", "write",
]
