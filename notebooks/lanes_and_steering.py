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

# %% [markdown]
# ## Steering: from the correction to the next token

# %%
steer_rows = steering.main(["--after", *map(str, AFTER_TOKENS), "--rtt-ms", f"{RTT_MS:g}", "--csv", "notebook_steering.csv"])

# %% [markdown]
# ## Both in one figure
#
# Left: time per subagent task for each arrangement (mean over the subagents; a lane waits for a slot when
# more subagents start together than a connection's 16 responses in flight). Middle: the connections the
# server holds for them. Right: from the steer to the next token, per alternative and steer point. This is
# the figure `docs/notebooks.md` shows.

# %%
fig, (ax_time, ax_conn, ax_steer) = plt.subplots(1, 3, figsize=(16, 4.4), gridspec_kw={"width_ratios": [1, 1, 1.3]})
# Two arrangements share each connection count: markers and dashes tell them apart where their lines coincide.
for arrangement, marker, line in zip(subagents.ARRANGEMENTS, "osD^", ("-", "--", ":", "-.")):
    mine = [r for r in rows if r["arrangement"] == arrangement]
    for ax, column in ((ax_time, "task_mean_s"), (ax_conn, "connections")):
        ax.plot([r["agents"] for r in mine], [r[column] for r in mine], marker=marker, linestyle=line, label=arrangement)
ax_time.set(xlabel="subagents at once", ylabel="time per subagent task, mean (s)", xscale="log", title="Lanes: time per task")
ax_conn.set(xlabel="subagents at once", ylabel="connections", xscale="log", yscale="log", title="Lanes: connections the server holds")
for ax in (ax_time, ax_conn):
    ax.set_xticks(AGENTS, [str(n) for n in AGENTS], minor=False)
    ax.minorticks_off()
ax_conn.set_yticks(sorted({1, *AGENTS}), [str(n) for n in sorted({1, *AGENTS})])
ax_time.legend(fontsize=8)
width = 0.8 / len(AFTER_TOKENS)
for k, after in enumerate(AFTER_TOKENS):
    values = [next(r["steer_to_token_s"] for r in steer_rows if r["alternative"] == a and r["after_tokens"] == after)
              for a in steering.ALTERNATIVES]
    ax_steer.bar([i + k * width for i in range(len(values))], values, width, label=f"steer after {after} tokens")
ax_steer.set_xticks([i + width * (len(AFTER_TOKENS) - 1) / 2 for i in range(len(steering.ALTERNATIVES))], steering.ALTERNATIVES,
                    rotation=20)
ax_steer.set(ylabel="steer to next token (s)", title="Steering: from the correction to the next token")
ax_steer.legend(fontsize=8)
fig.suptitle(f"Subagents and steering on the WebSocket design ({TURNS}-turn tasks, RTT {RTT_MS:g} ms, 1,000 tokens/s, "
             "virtual time)")
fig.tight_layout()
path = notebook.results_path("notebook_lanes_and_steering.png")
fig.savefig(path, dpi=110, bbox_inches="tight")
print(f"wrote {path}")
plt.show()
