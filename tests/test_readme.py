"""The README's quickstart, run as written: each ```python block under "## Quickstart" against `python -m prototype serve`."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytest.importorskip("websockets")  # client.responses.connect() needs openai[realtime]

SECTION = re.compile(r"^## Quickstart\b.*?(?=^## )", re.S | re.M)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# The output a snippet prints, as the README shows it: the plain block after "prints".
PRINTED_BLOCK = re.compile(r"^```python\n.*?^```\n\nprints\n\n```\n(.*?)^```", re.S | re.M)
README_ADDRESS = "127.0.0.1:8000"


def quickstart_snippets() -> list[str]:
    section = SECTION.search((REPO / "README.md").read_text())
    assert section is not None, "README.md has no '## Quickstart' section"
    return PYTHON_BLOCK.findall(section.group(0))


def quickstart_outputs() -> list[str]:
    return PRINTED_BLOCK.findall(SECTION.search((REPO / "README.md").read_text()).group(0))


@pytest.mark.slow
def test_each_quickstart_snippet_runs_against_serve(cli_server, tmp_path):
    server = cli_server()  # the default modeled costs, as a reader's `serve` has them
    script = tmp_path / "snippet.py"  # not named after a module the snippet imports
    for snippet, design in zip(quickstart_snippets(), ("http-stored", "chained", "suspended"), strict=True):
        script.write_text(snippet.replace(README_ADDRESS, f"127.0.0.1:{server.port}"))
        done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, (design, done.stderr)
        if design != "suspended":  # the output the README shows (v1's names a response id, which differs per server)
            assert done.stdout == quickstart_outputs()[0]
        lines = done.stdout.splitlines()
        assert [line.split()[:2] for line in lines[:2]] == [["tool", "call:"]] * 2, done.stdout  # fixed:3: two tool calls
        assert lines[2].split()[0] in ("completed", "response.completed"), done.stdout
        if design == "suspended":  # one response across the whole task
            assert lines[0].split()[-1] == lines[1].split()[-1]
        # The access log names the design; its line is written just after the response's last frame: wait (bounded).
        deadline = time.monotonic() + 60  # a hang guard, generous for a loaded machine
        while f" {design} " not in "".join(server.stdout[8:]) and time.monotonic() < deadline:
            time.sleep(0.01)
    _, log, _ = server.stop()
    designs = [line.split()[2] for line in log.splitlines()[8:] if line != "stopped"]
    assert {"http-stored", "chained", "suspended"} <= set(designs), log
