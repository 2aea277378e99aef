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
# # Latency experiments: where API overhead starts to dominate the agent loop
#
# OpenAI's post makes a simple argument. While inference was slow (about 65 tokens/s), the API's
# own work per request (validation, safety, rendering, routing, billing) was hidden behind
# decoding. At Codex-Spark speeds (1,000 tokens/s, bursts to 4,000) the same work became the
# bottleneck of an agent's tool loop. This notebook sweeps the four quantities that decide when
# that happens, on the same seeded coding tasks for every design:
#
# 1. **decode speed**, 65 to 4,000 tokens/s;
# 2. **tool time**, the client's share of each turn;
# 3. **history length**, the tokens in the conversation before the loop starts;
# 4. **round-trip time** between the client and the API.
#
# For each sweep it plots every design's end-to-end time per task and its gain over stateless http.
# All runs use virtual time (`prototype.benchmark.run_design_virtual`) and are deterministic. Every
# grid goes through the sweep runner (`prototype/sweep.py`): worker processes, or a Dask cluster with
# `CLUSTER = "local"` or `"tcp://scheduler:8786"`; results are cached on disk, so re-running the
# notebook or extending a sweep computes only what changed. Tables come from `prototype/analysis.py`,
# figures from `prototype/figures/`. Set `TESTBED_NOTEBOOK_TEST=1` to shrink the notebook to a smoke test.

# %% tags=["parameters"]
DESIGNS = ("http", "chained", "suspended")  # add "http-stored" to see previous_response_id over HTTP
PRESET = "coding"  # workload preset (prototype/workload.py)
TRACE = None  # or a trace file to replay instead (prototype/traces: testbed, TraceLab or Codex); its first N_TASKS tasks
SEED = 0
N_TASKS = 5  # seeded tasks per point (the same tasks for every design); one task's routing draws make bumpy curves
TURNS = 20  # turns per task (the post's "20+ tool calls")
TOOL_SECONDS = 0.3  # client tool time per call outside the tool sweep: TraceLab's median
DECODE_TPS = 1000.0  # decode speed outside the decode sweep: Codex-Spark
RTT_MS = 20.0  # round trip outside the RTT sweep: same region
DECODE_SPEEDS = (65, 125, 250, 500, 1000, 2000, 4000)  # tokens/s
TOOL_TIMES = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 60.0)  # seconds per call
HISTORIES = (1000, 8000, 32000, 128000)  # tokens of the initial prompt
RTTS_MS = (1.0, 20.0, 80.0, 150.0)  # docs/parameters.md §5 priors
JOBS = None  # worker processes (None: one per core; 1: in the kernel)
CLUSTER = None  # a Dask scheduler address, or "local" for a LocalCluster
# experiments/kv_memory.py at a small size: 4 and 16 agents on an engine with a 120k-token KV budget
KV_MEMORY_ARGV = ["--agents", "4", "16", "--configs", "suspended:hold", "chained:ttl-300", "chained:discard",
                  "--turns", "6", "--budget", "120000", "--output", "kv_memory_small"]
SAVE_FIGURE = True

# %%
import importlib.util
import json
import time

import attrs
import matplotlib
import matplotlib.pyplot as plt

from prototype import analysis, benchmark, figures, headline, notebook, sweep, traces, uncertainty
from prototype import workload as wl
from prototype.cli.common import plural

notebook.add_repo_to_path()  # `experiments` imports from any working directory
if notebook.notebook_test_mode():  # a smoke test: short tasks, two or three points per sweep, no workers
    N_TASKS, TURNS, JOBS = 1, 3, 1
    DECODE_SPEEDS, TOOL_TIMES, HISTORIES, RTTS_MS = (65, 1000, 4000), (0.1, 10.0), (1000, 32000), (1.0, 80.0)
    KV_MEMORY_ARGV = ["--agents", "3", "--configs", "suspended:hold", "chained:ttl-300", "--turns", "3",
                      "--budget", "30000", "--output", "kv_memory_small"]
print(f"test mode: {notebook.notebook_test_mode()}; {plural(N_TASKS, 'task')} of {TURNS} turns per point, designs {DESIGNS}")


runner = sweep.Runner(sweep.executor_for(CLUSTER, JOBS))


def tasks(**overrides):
    """The seeded tasks of every point: TURNS turns, TOOL_SECONDS per call, unless overridden. With TRACE, the trace's
    tasks with their own turns, run one after another; the tool-time and history sweeps replace their tool times and
    first prompts."""
    params = {"fixed_turns": TURNS, "fixed_tool_seconds": TOOL_SECONDS, **overrides}
    if TRACE:
        return tuple(traces.adjusted(t, tool_seconds=params["fixed_tool_seconds"], closed_loop=True,
                                     initial_prompt_tokens=params.get("initial_prompt_tokens"))
                     for t in traces.load(TRACE).tasks[:N_TASKS])
    return tuple(wl.generate(PRESET, seed=SEED, n_tasks=N_TASKS, **params))


def config(task_list, rtt_ms=RTT_MS):
    return benchmark.BenchConfig(task_list=task_list, network=attrs.evolve(benchmark.DEFAULT_NETWORK, rtt=rtt_ms / 1000))


def sweep(name, values, configure):
    started = time.perf_counter()
    before = runner.executed
    rows = benchmark.design_sweep(runner, name, values, configure, designs=DESIGNS)
    table = analysis.sweep_table(rows, name)
    print(f"{name}: {len(values)} points x {len(DESIGNS)} designs in {time.perf_counter() - started:.1f} s (real), "
          f"{runner.executed - before} computed")
    return table


def show(table, key, columns=("e2e_mean_s", "gain_vs_http", "api_s_per_turn", "decode_s_per_turn", "ttft_p50_ms")):
    notebook.show_markdown(analysis.markdown_table(table, [key, "design", *columns]))


# %% [markdown]
# ## 1. Decode speed: 65 to 4,000 tokens/s
#
# The left panel shows end-to-end time per task. The middle panel shows what a turn costs: decode
# time is the same in every design (black), while API work per turn depends on the design. Where
# the black line drops below a design's API line, that design's loop spends more time in the API
# than in sampling tokens. The right panel shows each design's gain over stateless http.

# %%
decode = sweep("decode_tps", DECODE_SPEEDS, lambda tps: (tps, config(tasks())))
fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
figures.sweep_plot(left, decode, "decode_tps", "e2e_mean_s", logx=True, logy=True, xlabel="decode speed (tokens/s)",
                 ylabel="end-to-end time per task, mean (s)", title="End to end")
left.legend(fontsize=8)
xs, decode_s = analysis.series(decode, "decode_tps", "decode_s_per_turn", DESIGNS[0])
middle.plot(xs, decode_s, color="black", marker=".", label="decode (every design)")
figures.sweep_plot(middle, decode, "decode_tps", "api_s_per_turn", logx=True, logy=True, linestyle="--",
                 label_suffix=": API work", xlabel="decode speed (tokens/s)", ylabel="seconds per turn",
                 title="Per turn: decode vs API work")
crossovers = {}
for design in DESIGNS:
    _, api_s = analysis.series(decode, "decode_tps", "api_s_per_turn", design)
    crossovers[design] = analysis.crossover(xs, api_s, decode_s)
    if crossovers[design] is not None:
        middle.axvline(crossovers[design], color=figures.DESIGN_COLORS.get(design), linewidth=0.8, linestyle=":")
middle.legend(fontsize=7)
figures.sweep_plot(right, decode, "decode_tps", "gain_vs_http", logx=True, xlabel="decode speed (tokens/s)",
                 ylabel="gain over http (1 - design / http)", title="Gain over stateless http")
fig.tight_layout()
plt.show()
show(decode, "decode_tps")

# %%
for design, x in crossovers.items():
    if x is None:
        print(f"{design}: API work per turn stays below decode time per turn over {xs[0]:g}-{xs[-1]:g} tokens/s.")
    elif x <= xs[0]:
        print(f"{design}: API work per turn exceeds decode time per turn already at {xs[0]:g} tokens/s.")
    else:
        print(f"{design}: API work per turn overtakes decode time per turn at about {x:.0f} tokens/s.")


def gain_of(table, design, x, key="decode_tps"):
    """A design's gain over http at one point of a sweep, as an estimate with its 95% interval over the tasks."""
    row = next(r for r in table if r[key] == x and r["design"] == design)
    return uncertainty.Estimate(row["gain_vs_http"], row["gain_vs_http_low"], row["gain_vs_http_high"], row["tasks"],
                                "tasks", "paired bootstrap")


for design in DESIGNS:
    if design == "http":
        continue
    first, last = gain_of(decode, design, xs[0]), gain_of(decode, design, xs[-1])
    trend = "grows" if last.value > first.value else "does not grow"
    print(f"{design} vs http: gain {first.scaled(100).format('{:.1f}%')} at {xs[0]:g} tokens/s and "
          f"{last.scaled(100).format('{:.1f}%')} at {xs[-1]:g} tokens/s (95% intervals over {first.n} tasks); the gain "
          f"{trend} with decode speed, as the model builds in (a per-turn cost against a shrinking shared time).")

# The numbers docs/notebooks.md quotes from this sweep, with the picture below (prototype/headline.py).
sweep_workload = (f"{N_TASKS} tasks of the '{PRESET}' preset (seed {SEED}), {TURNS} turns, every tool {TOOL_SECONDS:g} s, "
                  f"RTT {RTT_MS:g} ms, virtual time")
headline.write(notebook.results_path("notebook_latency_sweeps.json"), {"headline": headline.section(
    "notebook_latency_sweeps", command="notebooks/latency_experiments.py", workload=sweep_workload,
    figures={f"gain.{d}.{x:g}": headline.figure(gain_of(decode, d, x), "{:.1f}%", scale=100,
                                                label=f"{d} vs http at {x:g} tokens/s")
             for d in DESIGNS if d != "http" for x in xs})})

# %% [markdown]
# **These gains are not the other pages' gains with 0.3 s tools.** The same comparison (chained
# against http, every tool 0.3 s) gives other numbers on other workloads: `python -m
# experiments.published` runs its decode-speed check on the `compact` preset (seed 7), whose first
# prompt is 8,000 tokens, and this notebook the `coding` preset (seed 0), whose first prompt is
# 30,000 tokens: every http turn resends and re-processes a larger conversation, so the gain over
# http is larger. The cell below prints the two side by side, each with its workload and its
# interval, the experiment's from the data the docs quote (docs/figures/published.json). With
# `PRESET = "compact"`, `SEED = 7` and `TURNS = 20` in the parameters cell this sweep runs the
# experiment's workload.

# %%
published_data = notebook.REPO / "docs" / "figures" / "published.json"
if published_data.is_file():
    quoted = json.loads(published_data.read_text())
    print(f"experiments.published ({quoted['workload']}):")
    for key, entry in quoted["figures"].items():
        if key.startswith("trend."):
            print(f"  chained vs http at {key.split('.', 1)[1]} tokens/s: {headline.render(entry)}")
    print(f"this notebook ({sweep_workload}):")
    for x in xs:
        if x in (65, 1000, 4000):
            gain = gain_of(decode, "chained", x).scaled(100)
            print(f"  chained vs http at {x:g} tokens/s: {gain.format('{:.1f}%', with_n=True)}")
else:
    print(f"{published_data} is not in this checkout: nothing to set beside this sweep.")

# %% [markdown]
# ## 2. Tool time
#
# Tool time is the client's own work, and no API design can shorten it. As it grows it takes a
# larger share of the loop, so every design's gain over http shrinks (docs/parameters.md §7: tool time
# "limits any gain").

# %%
tools = sweep("tool_s", TOOL_TIMES, lambda s: (DECODE_TPS, config(tasks(fixed_tool_seconds=s))))
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
figures.sweep_plot(left, tools, "tool_s", "e2e_mean_s", logx=True, logy=True, xlabel="tool time per call (s)",
                 ylabel="end-to-end time per task, mean (s)", title=f"End to end at {DECODE_TPS:g} tokens/s")
left.legend(fontsize=8)
figures.sweep_plot(right, tools, "tool_s", "gain_vs_http", logx=True, xlabel="tool time per call (s)",
                 ylabel="gain over http", title="Gain over stateless http")
fig.tight_layout()
plt.show()
show(tools, "tool_s", ("e2e_mean_s", "gain_vs_http", "tool_s_per_turn", "api_s_per_turn"))
for design in DESIGNS:
    if design != "http":
        ts, gains = analysis.series(tools, "tool_s", "gain_vs_http", design)
        print(f"{design} vs http: gain {100 * gains[0]:.0f}% with {ts[0]:g} s tools, {100 * gains[-1]:.0f}% with "
              f"{ts[-1]:g} s tools.")

# %% [markdown]
# ## 3. History length
#
# A stateless http request resends the whole conversation, and the API validates, classifies and
# renders all of it again on every turn. The chained cache and the suspended Response process only
# the new items. The x axis is the initial prompt; each turn adds its tool output and the model's
# answer on top.

# %%
history = sweep("history_tokens", HISTORIES, lambda n: (DECODE_TPS, config(tasks(initial_prompt_tokens=n))))
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
figures.sweep_plot(left, history, "history_tokens", "e2e_mean_s", logx=True, xlabel="initial prompt (tokens)",
                 ylabel="end-to-end time per task, mean (s)", title=f"End to end at {DECODE_TPS:g} tokens/s")
left.legend(fontsize=8)
figures.sweep_plot(right, history, "history_tokens", "api_s_per_turn", logx=True, logy=True,
                 xlabel="initial prompt (tokens)", ylabel="API work per turn (s)", title="API work per turn")
fig.tight_layout()
plt.show()
show(history, "history_tokens", ("e2e_mean_s", "gain_vs_http", "api_s_per_turn", "prefill_s_per_turn", "cached_share"))
for design in DESIGNS:
    hs, api_s = analysis.series(history, "history_tokens", "api_s_per_turn", design)
    print(f"{design}: API work per turn {1000 * api_s[0]:.0f} ms at {hs[0]:,} tokens, {1000 * api_s[-1]:.0f} ms at "
          f"{hs[-1]:,} tokens ({api_s[-1] / api_s[0]:.1f}x).")

# %% [markdown]
# **Where http's curve dips.** One http turn in ten is routed to an engine that holds none of the
# conversation (the http affinity, docs/parameters.md §6), which then prefills all of it again. Which
# turns miss is drawn from a hash of the conversation's first item, so every prompt length draws
# anew, and a miss late in a task (a large context) costs far more than an early one. With few tasks
# per point these draws can outweigh the prompt's own size: a longer prompt can come out faster
# when its misses fell earlier. The cell below names any such dip with the cached share that
# explains it; the chained and suspended designs always reach their cache, so their curves rise.

# %%
for design in DESIGNS:
    hs, e2e = analysis.series(history, "history_tokens", "e2e_mean_s", design)
    _, cached = analysis.series(history, "history_tokens", "cached_share", design)
    _, prefill = analysis.series(history, "history_tokens", "prefill_s_per_turn", design)
    for i in range(len(hs) - 1):
        if e2e[i + 1] < e2e[i]:
            print(f"{design}: {e2e[i]:.1f} s a task at {hs[i]:,} tokens but {e2e[i + 1]:.1f} s at {hs[i + 1]:,}: the "
                  f"prefix cache held {100 * cached[i]:.1f}% of its input tokens against {100 * cached[i + 1]:.1f}%, "
                  f"and prefill took {1000 * prefill[i]:.0f} against {1000 * prefill[i + 1]:.0f} ms a turn.")

# %% [markdown]
# ## 4. Round-trip time
#
# Every design pays one round trip per turn on an open connection: stateless http over a kept-alive
# connection, a chained `response.create`, or a suspended `response.append`. A new connection
# costs handshakes once per rollout. So RTT moves every design by about the same amount per turn,
# and the differences between designs come from server work, not from the network.

# %%
rtt = sweep("rtt_ms", RTTS_MS, lambda ms: (DECODE_TPS, config(tasks(), rtt_ms=ms)))
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
figures.sweep_plot(left, rtt, "rtt_ms", "e2e_mean_s", xlabel="round-trip time (ms)",
                 ylabel="end-to-end time per task, mean (s)", title=f"End to end at {DECODE_TPS:g} tokens/s")
left.legend(fontsize=8)
figures.sweep_plot(right, rtt, "rtt_ms", "gain_vs_http", xlabel="round-trip time (ms)", ylabel="gain over http",
                 title="Gain over stateless http")
fig.tight_layout()
plt.show()
show(rtt, "rtt_ms", ("e2e_mean_s", "gain_vs_http", "network_s_per_turn", "ttft_p50_ms"))
for design in DESIGNS:
    rs, e2e = analysis.series(rtt, "rtt_ms", "e2e_mean_s", design)
    round_trips = 1000 * (e2e[-1] - e2e[0]) / (rs[-1] - rs[0])  # seconds of e2e per second of RTT
    extra = round_trips - TURNS
    where = (f"one per turn plus {extra:.1f} once, for opening the connection" if extra >= -0.05
             else f"{round_trips / TURNS:.2f} per turn")
    print(f"{design}: from {rs[0]:g} to {rs[-1]:g} ms RTT a task of {TURNS} turns takes {round_trips:.1f} round trips "
          f"longer: {where}.")

# %% [markdown]
# ## The four sweeps together
#
# End-to-end time per task for every design in each sweep. This is the figure
# `docs/notebooks.md` shows.

# %%
fig, axes = plt.subplots(2, 2, figsize=(12, 8))
for ax, (table, key, label, logx, logy) in zip(axes.flat, (
    (decode, "decode_tps", "decode speed (tokens/s)", True, True),
    (tools, "tool_s", "tool time per call (s)", True, True),
    (history, "history_tokens", "initial prompt (tokens)", True, False),
    (rtt, "rtt_ms", "round-trip time (ms)", False, False),
)):
    figures.sweep_plot(ax, table, key, "e2e_mean_s", logx=logx, logy=logy, xlabel=label,
                     ylabel="end-to-end per task (s)")
axes.flat[0].legend(fontsize=8)
fig.suptitle(f"End-to-end time per task: {plural(N_TASKS, PRESET + ' task')} of {TURNS} turns, virtual time "
             f"(defaults: {DECODE_TPS:g} tokens/s, {TOOL_SECONDS:g} s tools, RTT {RTT_MS:g} ms)")
fig.tight_layout()
if SAVE_FIGURE:
    path = notebook.results_path("notebook_latency_sweeps.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
plt.show()

# %% [markdown]
# ## Engine memory under concurrency
#
# The sweeps above run one agent at a time. Keeping state has a price when many agents share one
# engine: a suspended Response holds its KV for the whole pause, while the chained design's prefix
# cache can evict or expire it. `experiments/kv_memory.py` runs N concurrent agents against one
# modeled H100 and reports throughput, queueing, recomputed prefill and resident KV per design and
# retention policy. This section runs it at the size set by `KV_MEMORY_ARGV`, and skips it when
# that experiment is not in this checkout.

# %%
if importlib.util.find_spec("experiments") is None or importlib.util.find_spec("experiments.kv_memory") is None:
    print("experiments/kv_memory.py is not in this checkout: section skipped.")
else:
    from experiments import kv_memory

    backend = matplotlib.get_backend()  # kv_memory draws with Agg; the notebook's backend is restored
    started = time.perf_counter()
    kv_rows = kv_memory.main(KV_MEMORY_ARGV + (["--cluster", CLUSTER] if CLUSTER else []) + (["--jobs", str(JOBS)] if JOBS else []))
    matplotlib.use(backend)
    print(f"kv_memory: {len(kv_rows)} configurations in {time.perf_counter() - started:.1f} s (real)")
    columns = [c for c in getattr(kv_memory, "TABLE", kv_rows[0]) if c in kv_rows[0]]
    notebook.show_markdown(analysis.markdown_table(kv_rows, columns))
    # The notebook's small run writes kv_memory_small.*, keeping the full run's kv_memory.* intact.
    picture = notebook.results_path(KV_MEMORY_ARGV[KV_MEMORY_ARGV.index("--output") + 1] + ".png")
    if picture.exists():
        notebook.show_image(picture)
