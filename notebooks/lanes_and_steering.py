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
# # Lanes and steering: the WebSocket design as it ships
#
# Two questions about the shipped v2 (docs/protocol.md, Lanes and Steering):
#
# 1. **Subagents.** N agents at once over one multiplexed connection (`stream_id` lanes), over one
#    connection each, or as one suspended v1 response each: time per task, connections, KV.
# 2. **Steering.** From the user's correction to the first token that follows it: `response.steer`
#    on v2 against what v1 and http can do instead (wait for the tool round, or restart).
#
# Both run under virtual time through `experiments/subagents.py` and `experiments/steering.py`.
# Set `TESTBED_NOTEBOOK_TEST=1` to shrink the notebook to a smoke test.

# %% tags=["parameters"]
AGENTS = [2, 8, 32]  # the README table's rows; add 4 and 16 for the whole curve
TURNS = 6
AFTER_TOKENS = [50, 150, 250]  # tokens of the 300-token message streamed before the steer
RTT_MS = 20.0

# %%
import matplotlib.pyplot as plt

from prototype import notebook

notebook.add_repo_to_path()  # `experiments` imports from any working directory
from experiments import steering, subagents

if notebook.notebook_test_mode():
    AGENTS, TURNS, AFTER_TOKENS = [2], 2, [50]
print(f"test mode: {notebook.notebook_test_mode()}")

# %% [markdown]
# ## Subagents over one socket, or one each
#
# The memory part (a child server process, real time) is skipped here; run
# `python -m experiments.subagents` for it.

# %%
rows = subagents.main(["--agents", *map(str, AGENTS), "--turns", str(TURNS), "--rtt-ms", f"{RTT_MS:g}", "--no-rss", "--csv", "notebook_subagents.csv"])

# %%
fig, (ax_time, ax_conn) = plt.subplots(1, 2, figsize=(11, 4))
for arrangement in subagents.ARRANGEMENTS:
    mine = [r for r in rows if r["arrangement"] == arrangement]
    ax_time.plot([r["agents"] for r in mine], [r["task_mean_s"] for r in mine], marker="o", label=arrangement)
    ax_conn.plot([r["agents"] for r in mine], [r["connections"] for r in mine], marker="o", label=arrangement)
ax_time.set(xlabel="subagents at once", ylabel="time per task (s)", xscale="log", title="time per subagent task")
ax_conn.set(xlabel="subagents at once", ylabel="connections", xscale="log", yscale="log", title="connections the server holds")
ax_time.legend()

# %% [markdown]
# ## Steering: from the correction to the next token

# %%
steer_rows = steering.main(["--after", *map(str, AFTER_TOKENS), "--rtt-ms", f"{RTT_MS:g}", "--csv", "notebook_steering.csv"])

# %%
fig2, ax = plt.subplots(figsize=(8, 4))
width = 0.8 / len(AFTER_TOKENS)
for k, after in enumerate(AFTER_TOKENS):
    values = [next(r["steer_to_token_s"] for r in steer_rows if r["alternative"] == a and r["after_tokens"] == after) for a in steering.ALTERNATIVES]
    ax.bar([i + k * width for i in range(len(values))], values, width, label=f"steer after {after} tokens")
ax.set_xticks([i + width * (len(AFTER_TOKENS) - 1) / 2 for i in range(len(steering.ALTERNATIVES))], steering.ALTERNATIVES, rotation=20)
ax.set(ylabel="steer to next token (s)", title="steering latency")
ax.legend()
path = notebook.results_path("notebook_lanes_and_steering.png")
fig2.savefig(path, dpi=110, bbox_inches="tight")
print(f"wrote {path}")
