"""The arguments the simulated model writes for a client function call.

Two kinds of tool:

* Tools a coding agent's client runs for real, recognised by name and schema: Codex's
  `exec_command` (`cmd`), `shell` (`command` as argv), `shell_command` (`command` as a string),
  `update_plan`, `write_stdin`, `apply_patch`, `read_file`, `list_dir`, `grep_files` and
  `view_image` (their schemas as Codex 0.101.0 and 0.171.0 send them; docs/codex.md). The model
  calls them as an agent exploring a repository does: list the files, read them, run the tests.
  The shell commands are read-only and harmless, and exit 0 in any folder (an empty one included),
  so a client that runs them under a read-only sandbox reports success.
* Any other tool: a value valid for its JSON schema, drawn from the seed (so runs repeat) and
  checked with `jsonschema`. The draw honours `enum`, `const`, `anyOf`/`oneOf`/`allOf` (first
  branch), `type` lists, `required`, `additionalProperties`, `minProperties`, `minItems`/`maxItems`,
  `minLength`/`maxLength`, `pattern` (a string drawn from the regular expression by `rstr`), and
  `minimum`/`maximum` with their exclusive forms and `multipleOf`. Numbers are whole: clients
  parse `number` fields into integers (Codex reads `yield_time_ms` as usize and refuses 0.522).

`tools_an_agent_would_call` narrows the choice of tool the same way: offered a shell tool, an
agent works through it; it does not call `request_user_input` (refused outside Plan mode) or an
MCP tool with made-up server names.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
from collections.abc import Sequence
from typing import Any

import jsonschema
import numpy as np
import rstr

from ..protocol.events import ToolDef
from . import tokenizer

log = logging.getLogger(__name__)

# What an agent runs first in a repository it has not seen, in order: list it, list its files,
# read its Python sources, run its tests. Each exits 0 wherever it runs: `find`, `for` over an
# empty list and `tail` at the end of a pipe all succeed, and nothing writes to the folder.
EXPLORE_COMMANDS: tuple[str, ...] = (
    "ls -la",
    "find . -maxdepth 2 -type f -not -path '*/.*' | sort | head -n 50",
    "for f in $(find . -maxdepth 1 -type f -name '*.py' | sort | head -n 3); do echo \"== $f\"; sed -n '1,60p' \"$f\"; done",
    "if ls test_*.py >/dev/null 2>&1; then python3 -B -m unittest -q 2>&1 | tail -n 20; else echo 'no tests found'; fi",
)

SHELL_TOOLS = ("exec_command", "shell", "shell_command", "local_shell", "container.exec")
# Tools that succeed on a read-only repository with no state from earlier calls.
READ_ONLY_TOOLS = ("update_plan",)


def command_for(call_number: int) -> str:
    return EXPLORE_COMMANDS[call_number % len(EXPLORE_COMMANDS)]


def _properties(tool: ToolDef) -> dict[str, Any]:
    parameters = tool.parameters if isinstance(tool.parameters, dict) else {}
    properties = parameters.get("properties")
    return properties if isinstance(properties, dict) else {}


def _type_of(schema: Any) -> str | None:
    return schema.get("type") if isinstance(schema, dict) and isinstance(schema.get("type"), str) else None


def known_arguments(tool: ToolDef, call_number: int) -> dict[str, Any] | None:
    """What an agent passes to a well-known tool, or None if the tool is not one of them."""
    properties = _properties(tool)
    name = tool.name or ""
    command = command_for(call_number)
    if name in SHELL_TOOLS:
        if _type_of(properties.get("cmd")) == "string":
            return {"cmd": command}
        if _type_of(properties.get("command")) == "string":
            return {"command": command}
        if _type_of(properties.get("command")) == "array":
            return {"command": ["bash", "-lc", command]}
        return None
    if name == "update_plan" and _type_of(properties.get("plan")) == "array":
        steps = ("List the repository", "Read the sources", "Run the tests")
        done = min(call_number, len(steps) - 1)
        plan = [{"step": step, "status": "completed" if i < done else "in_progress" if i == done else "pending"}
                for i, step in enumerate(steps)]
        return {"explanation": "Exploring before any change.", "plan": plan}
    if name == "write_stdin" and "session_id" in properties:
        return {"session_id": 1, "chars": ""}  # a poll: writes nothing
    if name == "apply_patch" and _type_of(properties.get("input")) == "string":
        return {"input": "*** Begin Patch\n*** End Patch\n"}  # an empty patch: changes nothing
    if name == "read_file" and "file_path" in properties:
        return {"file_path": "README.md", "offset": 1, "limit": 40}
    if name == "list_dir" and "dir_path" in properties:
        return {"dir_path": ".", "offset": 1, "limit": 50, "depth": 2}
    if name == "grep_files" and "pattern" in properties:
        return {"pattern": "def test_", "limit": 20}
    if name == "view_image" and "path" in properties:
        return {"path": "screenshot.png"}
    return None


def tools_an_agent_would_call(tools: Sequence[ToolDef]) -> list[ToolDef]:
    """The function tools the model chooses from: the shell tools if any is offered, else the
    read-only ones, else every tool (a harness's own tools, unknown to this module)."""
    for names in (SHELL_TOOLS, READ_ONLY_TOOLS):
        usable = [tool for tool in tools if tool.name in names and known_arguments(tool, 0) is not None]
        if usable:
            return usable
    return list(tools)


def arguments_for(tool: ToolDef, call_number: int, rng: np.random.Generator) -> Any:
    """The arguments of the model's `call_number`-th call of the task (0-based) to `tool`."""
    known = known_arguments(tool, call_number)
    if known is not None:
        return known
    parameters = tool.parameters if isinstance(tool.parameters, dict) else {}
    return schema_valid_value({"type": "object", **parameters}, rng)  # function arguments are an object


# --- schema-valid values for any other tool -----------------------------------------------------


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    # A client's schema is checked against its metaschema first: the validator trusts it, and a
    # broken keyword (`multipleOf: 0`) fails inside validation with an error of its own (ZeroDivisionError).
    cls.check_schema(schema)
    return cls(schema)


def schema_valid_value(schema: dict[str, Any] | None, rng: np.random.Generator) -> Any:
    """A value valid for `schema`, drawn from `rng`. A schema this draw cannot satisfy (e.g. `not`,
    `if`/`then`, conflicting bounds) still gets a value, logged as invalid: a model can err too."""
    if not isinstance(schema, dict):
        return {}
    value = _draw(schema, rng)
    try:
        errors = list(_validator(json.dumps(schema, sort_keys=True)).iter_errors(value))
    except jsonschema.SchemaError:
        return value  # the tool's own schema is broken; nothing to check against
    if errors:
        log.warning("generated arguments do not satisfy the tool schema: %s", errors[0].message)
    return value


def _draw(schema: Any, rng: np.random.Generator) -> Any:
    if not isinstance(schema, dict):
        return {}
    if schema.get("enum"):
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _draw(schema[key][0], rng)
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return _draw_object(schema, rng)
    if kind == "array":
        low = int(schema.get("minItems", 1))
        count = min(max(low, 1), int(schema.get("maxItems", max(low, 1))))
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {"type": "string"}
        return [_draw(items, rng) for _ in range(count)]
    if kind == "string":
        return _draw_string(schema, rng)
    if kind in ("integer", "number"):
        return _draw_number(schema, rng)
    if kind == "boolean":
        return bool(rng.integers(0, 2))
    if kind == "null":
        return None
    return tokenizer.text_of(rng, 2).strip()  # no type: any JSON value is valid


def _draw_object(schema: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    # Required properties only, as a model mostly does: optional ones (timeouts, flags) keep the
    # client's defaults, and real clients' tools then get sane calls.
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [name for name in schema.get("required") or () if isinstance(name, str)]
    extra = schema.get("additionalProperties", True)
    value = {}
    for name in [*(n for n in properties if n in required), *(n for n in required if n not in properties)]:
        sub = properties.get(name, extra if isinstance(extra, dict) else {"type": "string"})
        value[name] = _draw(sub, rng)
    for name in properties:  # up to minProperties, with declared optional properties
        if len(value) >= int(schema.get("minProperties", 0)):
            break
        value.setdefault(name, _draw(properties[name], rng))
    return value


def _draw_string(schema: dict[str, Any], rng: np.random.Generator) -> str:
    low = int(schema.get("minLength", 0))
    high = schema.get("maxLength")
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        draw = rstr.Rstr(random.Random(int(rng.integers(2**32))))
        text = ""
        for _ in range(20):  # a pattern and length bounds together: draw until both hold
            text = draw.xeger(pattern)
            if len(text) >= low and (high is None or len(text) <= int(high)):
                break
        return text
    text = tokenizer.text_of(rng, 2).strip()
    while len(text) < low:
        text += tokenizer.text_of(rng, 2)
    return text if high is None else text[: int(high)]


def _whole_bound(schema: dict[str, Any], inclusive: str, exclusive: str, *, lower: bool) -> int | None:
    """The tightest whole-number bound from `minimum`/`exclusiveMinimum` (or the maximums)."""
    bounds = []
    value = schema.get(inclusive)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        bounds.append(math.ceil(value) if lower else math.floor(value))
    value = schema.get(exclusive)
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # draft 4's boolean form is ignored
        bounds.append(math.floor(value) + 1 if lower else math.ceil(value) - 1)
    if not bounds:
        return None
    return max(bounds) if lower else min(bounds)


def _draw_number(schema: dict[str, Any], rng: np.random.Generator) -> int:
    low = _whole_bound(schema, "minimum", "exclusiveMinimum", lower=True)
    high = _whole_bound(schema, "maximum", "exclusiveMaximum", lower=False)
    if low is None:
        low = 0 if high is None or high >= 0 else high - 9
    step = schema.get("multipleOf")
    step = step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else 1
    low = -(-low // step) * step  # the smallest multiple at or above the bound
    value = low + step * int(rng.integers(0, 10))
    return low if high is not None and value > high else value
