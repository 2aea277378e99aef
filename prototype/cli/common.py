"""What every command line of the project shares (`python -m prototype ...` and `experiments/*.py`).

* `Parser`: argparse without abbreviations (`--task 3` is refused rather than read as `--tasks 3`)
  and with a one-line error: `<prog>: error: <what> (see --help)`, exit status 2.
* `positive(kind)`, `at_least(minimum)`, `non_negative(kind)`: argparse `type`s that refuse a value out of range
  before any work starts, with the same one-line error (`argument --tasks: must be at least 1, not 0`).
* `list_of(kind)`: a list option that takes `1000,4000` as well as `1000 4000` (with `nargs="+"`
  and `action=FlatList`, or through `add_list`).
* `new_run_folder(base)`: each run writes into a new folder `base/<timestamp>/` and points
  `base/latest` at it, so a run never overwrites an earlier one.
* `RunFolder(base, out)`: the same folder, appearing only when the run completes: a failed or
  interrupted run leaves none, and `latest` only ever points at complete results.
* `run_command(prog, command)`: a command as a user meets it: output into a pipe its reader closed
  (`| head -3`) is dropped without a traceback while the command finishes its work, and Ctrl-C ends it
  with one line, `<prog>: interrupted`, and status 130.
* `plural(count, noun)`: "1 task", "2 tasks".
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

LATEST = "latest"
STAMP = "%Y%m%d-%H%M%S"
INTERRUPTED = 130  # the exit status of a command ended by Ctrl-C (128 + SIGINT), as a shell reports one


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`count` and the noun it takes: "1 task", "2 tasks", "1,000 tasks" (`nouns`: an irregular plural)."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


class Parser(argparse.ArgumentParser):
    """argparse with `allow_abbrev=False` and a one-line error message."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None) -> Any:
        """As argparse's, but an unknown option after a subcommand is refused by that subcommand's parser, so
        the error names it (`python -m prototype compare: error: unrecognized arguments: --task 3`)."""
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            for action in self._actions:
                if isinstance(action, argparse._SubParsersAction) and getattr(parsed, action.dest, None) in action.choices:
                    sub = action.choices[getattr(parsed, action.dest)]
                    if not isinstance(sub, Parser):
                        break
                    # The subcommand's own parser leaves unknown words to its parent; refuse them here.
                    sub.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def checked(kind: Callable[[str], Any], accept: Callable[[Any], bool], requirement: str) -> Callable[[str], Any]:
    """An argparse `type`: `kind(word)`, refused with `must be <requirement>, not <word>` unless `accept` takes it."""

    def parse(word: str) -> Any:
        value = kind(word)  # a ValueError here is argparse's own "invalid int value: 'x'"
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, not {word}")
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, not {word}")
        return value

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def positive(kind: Callable[[str], Any] = float) -> Callable[[str], Any]:
    """An argparse `type`: a number greater than 0 (a speed, a duration, a size)."""
    return checked(kind, lambda value: value > 0, "greater than 0")


def non_negative(kind: Callable[[str], Any] = float) -> Callable[[str], Any]:
    """An argparse `type`: a number of at least 0 (a delay, a seed, a port where 0 picks one)."""
    return checked(kind, lambda value: value >= 0, "at least 0")


def at_least(minimum: int, at_most: int | None = None) -> Callable[[str], Any]:
    """An argparse `type`: a whole number of at least `minimum` (a count of tasks, turns, workers), and at most
    `at_most` if given."""
    if at_most is None:
        return checked(int, lambda value: value >= minimum, f"at least {minimum}")
    return checked(int, lambda value: minimum <= value <= at_most, f"from {minimum} to {at_most}")


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
            except ValueError:  # an ArgumentTypeError (a value out of range) passes through as it is
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


def _point_latest(base: Path, folder: Path) -> None:
    link = base / LATEST
    temporary = base / f".{LATEST}.{os.getpid()}"
    if temporary.is_symlink() or temporary.exists():
        temporary.unlink()
    temporary.symlink_to(folder.name)
    os.replace(temporary, link)  # atomic: a reader never finds `latest` missing


def new_run_folder(base: str | os.PathLike[str], now: datetime.datetime | None = None) -> Path:
    """Create `base/<YYYYmmdd-HHMMSS>[-N]/` and point the symlink `base/latest` at it."""
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    stamp = (now or datetime.datetime.now()).strftime(STAMP)
    folder, n = base / stamp, 1
    while True:
        try:
            folder.mkdir()
            break
        except FileExistsError:
            n += 1
            folder = base / f"{stamp}-{n}"
    _point_latest(base, folder)
    return folder


class RunFolder:
    """A run's results folder that appears whole or not at all (a context manager).

    The run writes into `path`, a hidden staging folder (`.<stamp>.partial-<pid>`) beside where its results go;
    `publish()` moves it into place: to a new `base/<YYYYmmdd-HHMMSS>[-N]/` (the time the run started), with
    `base/latest` then pointing at it, or, when the user named a folder (`out`), its files into that folder. Leaving
    the block without publishing (an error, Ctrl-C, a refusal) removes the staging folder, so a failed run leaves no
    empty or partial folder and `latest` only ever points at a complete run. After `publish()`, `path` is where the
    results are."""

    def __init__(self, base: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                 now: datetime.datetime | None = None) -> None:
        self.base, self.out = Path(base), Path(out) if out else None
        self.stamp = (now or datetime.datetime.now()).strftime(STAMP)
        home = self.out.parent if self.out is not None else self.base
        name = self.out.name if self.out is not None else self.stamp
        home.mkdir(parents=True, exist_ok=True)
        self.path = home / f".{name}.partial-{os.getpid()}"
        if self.path.exists():  # left by a killed run of a process that had this id
            shutil.rmtree(self.path)
        self.path.mkdir()
        self.published = False

    def publish(self) -> Path:
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            for entry in sorted(self.path.iterdir()):
                target = self.out / entry.name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                os.replace(entry, target)
            self.path.rmdir()
            self.path = self.out
        else:
            folder, n = self.base / self.stamp, 1
            while True:
                try:
                    os.rename(self.path, folder)  # replaces only an empty folder; a run's folder is never empty
                    break
                except OSError:
                    if not folder.exists():
                        raise
                    n += 1
                    folder = self.base / f"{self.stamp}-{n}"
            _point_latest(self.base, folder)
            self.path = folder
        self.published = True
        return self.path

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.published:
            shutil.rmtree(self.path, ignore_errors=True)


# --- a command as a user meets it -----------------------------------------------------------------


class PipeSafeStdout:
    """sys.stdout, except that once the reader of a pipe has gone (`| head -3`) what is written is dropped: the
    descriptor is pointed at /dev/null, so neither this write, the later ones nor the flush at exit raise
    BrokenPipeError, and the command goes on to finish its work (its results folder complete)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False

    def _drop(self) -> None:
        self.broken = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.stream.fileno())
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def interrupted(error: BaseException) -> bool:
    """Ctrl-C: a KeyboardInterrupt, or an exception group of nothing else (trio raises it from inside a nursery)."""
    if isinstance(error, KeyboardInterrupt):
        return True
    if isinstance(error, BaseExceptionGroup):
        match, rest = error.split(KeyboardInterrupt)
        return match is not None and rest is None
    return False


def run_command(prog: str, command: Callable[[], int]) -> int:
    """`command()` as a user meets it: stdout safe from a closed pipe (PipeSafeStdout), and Ctrl-C reported as one
    line, `<prog>: interrupted`, with status 130 (INTERRUPTED), not a traceback."""
    stdout = sys.stdout
    safe = PipeSafeStdout(stdout) if stdout is not None and not isinstance(stdout, PipeSafeStdout) else None
    if safe is not None:
        sys.stdout = safe  # type: ignore[assignment]
    try:
        return command()
    except BaseException as error:
        if not interrupted(error):
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    finally:
        if safe is not None:
            safe.flush()  # what is still buffered for a pipe whose reader has gone is dropped here, not at exit
            sys.stdout = stdout
