"""What every command line of the project shares (`python -m prototype ...` and `experiments/*.py`).

* `Parser`: argparse without abbreviations (`--task 3` is refused rather than read as `--tasks 3`)
  and with a one-line error: `<prog>: error: <what> (see --help)`, exit status 2.
* `list_of(kind)`: a list option that takes `1000,4000` as well as `1000 4000` (with `nargs="+"`
  and `action=FlatList`, or through `add_list`).
* `new_run_folder(base)`: each run writes into a new folder `base/<timestamp>/` and points
  `base/latest` at it, so a run never overwrites an earlier one.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

LATEST = "latest"


class Parser(argparse.ArgumentParser):
    """argparse with `allow_abbrev=False` and a one-line error message."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def list_of(kind: Callable[[str], Any], choices: Sequence[Any] | None = None) -> Callable[[str], list[Any]]:
    """An argparse `type` reading one command-line word as a comma-separated list of `kind`."""

    def parse(word: str) -> list[Any]:
        values = []
        for part in word.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                value = kind(part)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{part!r} is not a valid {getattr(kind, '__name__', 'value')}") from None
            if choices is not None and value not in choices:
                raise argparse.ArgumentTypeError(f"{part!r} is not one of {', '.join(map(str, choices))}")
            values.append(value)
        if not values:
            raise argparse.ArgumentTypeError(f"{word!r} names no value")
        return values

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


class FlatList(argparse.Action):
    """Joins the lists of every word (`--speeds 65,1000 4000` is [65, 1000, 4000])."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, [v for word in values for v in word])


def add_list(
    parser: argparse.ArgumentParser,
    flag: str,
    kind: Callable[[str], Any],
    default: Iterable[Any] | None,
    help: str,
    choices: Sequence[Any] | None = None,
    nargs: str = "+",
) -> None:
    """A list option: `flag 1000,4000` or `flag 1000 4000`."""
    shown = f" (default {' '.join(f'{v:g}' if isinstance(v, float) else str(v) for v in default)})" if default else ""
    if choices is not None:
        shown += f"; choices: {', '.join(map(str, choices))}"
    parser.add_argument(
        flag, type=list_of(kind, choices), nargs=nargs, action=FlatList,
        default=list(default) if default is not None else None, metavar=flag.lstrip("-").upper().replace("-", "_"),
        help=f"{help}, separated by commas or spaces{shown}",
    )


def new_run_folder(base: str | os.PathLike[str], now: datetime.datetime | None = None) -> Path:
    """Create `base/<YYYYmmdd-HHMMSS>[-N]/` and point the symlink `base/latest` at it."""
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    folder, n = base / stamp, 1
    while True:
        try:
            folder.mkdir()
            break
        except FileExistsError:
            n += 1
            folder = base / f"{stamp}-{n}"
    link = base / LATEST
    temporary = base / f".{LATEST}.{os.getpid()}"
    if temporary.is_symlink() or temporary.exists():
        temporary.unlink()
    temporary.symlink_to(folder.name)
    os.replace(temporary, link)  # atomic: a reader never finds `latest` missing
    return folder
