# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The hosted-tool analogy: one suspension point, two backends
#
# OpenAI's overnight prototype treated a client tool call like a hosted tool call. When the model
# calls `web_search`, the sampling loop blocks, a web-search service answers, and the answer goes
# into the model's context. The prototype blocked the loop in the same way for a client function
# call, sent `response.done` over the WebSocket, and resumed when the client's `response.append`
# arrived.
#
# In the testbed that point is `SamplingLoop.tool_call_point` (`prototype/designs/sampling.py`).
# This notebook runs one small rollout that makes one hosted `web_search` and some client function
# calls, and draws it as a timeline. It then runs the same task under the chained (v2) and http
# designs, with each phase in the same colour in every figure, to show where each design spends its
# time and what state it keeps while the client runs a tool.
#
# Everything runs in virtual time (`prototype.benchmark.run_design_virtual`), so the figures come
# out the same on every run. Set `TESTBED_NOTEBOOK_TEST=1` to shrink the notebook to a smoke test.

# %% tags=["parameters"]
TURNS = 3  # model turns; every turn but the last ends with one client function call
DECODE_TPS = 1000.0  # tokens/s: Codex-Spark class, where the API's own work shows
OUTPUT_TOKENS = 80  # text tokens the model writes per turn
INITIAL_PROMPT_TOKENS = 4000
APPENDED_TOKENS = 600  # tokens of each tool output
TOOL_SECONDS = 0.8  # time the client's tool runs
HOSTED_SECONDS = 0.6  # latency of the hosted web_search service
HOSTED_RESULT_TOKENS = 300
HOSTED_TURNS = (0,)  # turns that first make a hosted web_search
RTT_MS = 20.0  # client to API round trip (same region)
DESIGNS = ("suspended", "chained", "http")
SAVE_FIGURE = True  # write the timeline to the results folder

# %%
import inspect

import attrs
import matplotlib.pyplot as plt

from prototype import analysis, benchmark, figures, netem, notebook, sweep
from prototype import workload as wl
from prototype.designs.sampling import SamplingLoop

if notebook.notebook_test_mode():  # a smoke test: the smallest task that still has both kinds of call
    TURNS, OUTPUT_TOKENS, INITIAL_PROMPT_TOKENS = 2, 20, 1000
print(f"test mode: {notebook.notebook_test_mode()}")

# %% [markdown]
# ## The one suspension point
#
# Every design runs the same sampling loop inside a response. When a turn ends in tool calls the
# loop reaches `tool_call_point`. A hosted call is answered there by the server's hosted tool
# service. A client function call is answered by the client: the suspended design waits for
# `response.append`, while the chained and http designs end the response and let the next request
# start a new loop.

# %%
print(inspect.getsource(SamplingLoop.tool_call_point))

# %% [markdown]
# ## The task
#
# A fixed task (`workload.fixed`) in which the chosen turns first make a hosted `web_search`. The
# harness then offers the `web_search` tool next to its own `read_file` and `run_command`.

# %%
base = wl.fixed(TURNS, initial_prompt_tokens=INITIAL_PROMPT_TOKENS, appended_tokens=APPENDED_TOKENS,
                output_tokens=OUTPUT_TOKENS, tool_seconds=TOOL_SECONDS, name="analogy")
hosted = (wl.HostedCall(seconds=HOSTED_SECONDS, result_tokens=HOSTED_RESULT_TOKENS),)
task = wl.Workload(base.name, base.seed, tuple(
    attrs.evolve(turn, hosted_calls=hosted) if k in HOSTED_TURNS and turn.tool_seconds else turn
    for k, turn in enumerate(base.turns)
))
notebook.show_markdown(analysis.markdown_table([
    {"turn": k, "appended tokens": t.appended_tokens, "output tokens": t.output_tokens,
     "hosted web_search s": sum(h.seconds for h in t.hosted_calls), "client tool s": sum(t.tool_seconds)}
    for k, t in enumerate(task.turns)
]))
config = benchmark.BenchConfig(task_list=(task,), network=attrs.evolve(netem.SAME_REGION, rtt=RTT_MS / 1000))

# %% [markdown]
# ## The suspended Response (v1)
#
# One `response.create`. Turn 0 samples, calls `web_search` (green, server lane), and the loop
# blocks while the hosted service answers. The model then calls a client function, and the loop
# blocks again at the same point. This time the server sends `response.done` and the client runs the
# tool (light green, client lane). The hatched band is the pause, during which the Response
# coroutine stays alive and holds its context and KV. `response.append` resumes the loop.

# %%
(suspended,) = benchmark.run_design_virtual("suspended", DECODE_TPS, config)
fig, ax = plt.subplots(figsize=(12, 2.8))
figures.timeline(ax, [suspended])
figures.annotate_tool_call_point(ax, suspended)
ax.set_title(f"suspended: one Response, {len(suspended.turns)} turns, {DECODE_TPS:g} tokens/s")
fig.tight_layout()
plt.show()

# %%
origin = suspended.started_at
for t, direction, kind in suspended.timeline:
    if not kind.endswith(".delta"):
        print(f"{1000 * (t - origin):9.1f} ms  {'C->S' if direction == 'send' else 'S->C'}  {kind}")

# %% [markdown]
# ## The same task, three designs
#
# The rows below use the same colours and time axis. Each design's pause band says what its server
# keeps while the client's tool runs.

# %%
# Through the sweep runner (prototype/sweep.py), in this kernel (three short runs), cached on disk.
grid = [benchmark.DesignRun(design, DECODE_TPS, config) for design in DESIGNS]
runs = sweep.Runner(sweep.InProcess()).map(benchmark.design_records, grid, desc="designs")
records = {run.design: rollouts[0] for run, rollouts in zip(grid, runs)}
fig, ax = plt.subplots(figsize=(12, 1.2 + 1.5 * len(records)))
figures.timeline(ax, list(records.values()))
if "suspended" in records:
    figures.annotate_tool_call_point(ax, records["suspended"], row=list(records).index("suspended"), rows=len(records))
ax.set_title(f"The same task under {', '.join(records)} ({DECODE_TPS:g} tokens/s, RTT {RTT_MS:g} ms)")
fig.tight_layout()
if SAVE_FIGURE:
    path = notebook.results_path("notebook_hosted_tool_timeline.png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"wrote {path}")
plt.show()

# %% [markdown]
# ## Where the time goes, and what is kept across the pause

# %%
fig, ax = plt.subplots(figsize=(10, 0.8 + 0.6 * len(records)))
figures.phase_bars(ax, {design: analysis.phase_totals(r) for design, r in records.items()},
                 xlabel="seconds, summed over the rollout's turns")
ax.set_title("End-to-end time by phase")
fig.tight_layout()
plt.show()
notebook.show_markdown(analysis.markdown_table(analysis.state_table(list(records.values()))))
for design, record in records.items():
    print(f"- {design}: {analysis.PAUSE_STATE[analysis.design_of(record)][1]}.")

# %% [markdown]
# What the numbers say (computed from this run):

# %%
api = {design: sum(analysis.phase_totals(r).get(p, 0.0) for p in analysis.API_OVERHEAD_PHASES) for design, r in records.items()}
hosted_s = {design: analysis.phase_totals(r).get("hosted_tool", 0.0) for design, r in records.items()}
fastest = min(records, key=lambda d: records[d].seconds)
slowest = max(records, key=lambda d: records[d].seconds)
print(f"The fastest design here is {fastest} ({records[fastest].seconds:.2f} s) and the slowest is {slowest} "
      f"({records[slowest].seconds:.2f} s).")
print(f"The API's own work costs {', '.join(f'{d} {api[d]:.2f} s' for d in records)}.")
if max(hosted_s.values()) - min(hosted_s.values()) < 1e-6:
    print(f"Hosted tool time is {next(iter(hosted_s.values())):.2f} s in every design: the hosted call is answered "
          "inside the response, whatever the design does at the client's calls.")
else:
    print(f"Hosted tool time differs between designs: {hosted_s}.")
ids = {design: len(r.response_ids) for design, r in records.items()}
print(f"Response ids per rollout: {ids}. The suspended design keeps one Response across every pause; the "
      "other designs start a new response for each turn.")
