"""The sweep runner's results cache (prototype/sweep.py keys the runs): each value on disk under its key, one
pickle per key, in $TESTBED_CACHE, else results/cache (git-ignored)."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import attrs

CACHE_ENV = "TESTBED_CACHE"
REPO = Path(__file__).resolve().parent.parent


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or REPO / "results" / "cache")


@attrs.define
class Cache:
    """Values on disk, one pickle per key, written atomically (a crash leaves no half-written row)."""

    root: Path = attrs.field(factory=default_cache_dir, converter=Path)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.pickle"

    def holds(self, key: str) -> bool:
        return self._path(key).is_file()

    def get(self, key: str) -> tuple[bool, Any]:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return False, None
        try:
            return True, pickle.loads(data)
        except Exception:  # noqa: BLE001 - an unreadable entry is recomputed and overwritten
            return False, None

    def put(self, key: str, value: Any) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)  # a value that cannot be pickled leaves no half-written file behind
            raise

