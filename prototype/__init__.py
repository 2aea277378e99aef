"""prototype: a testbed for the agent tool loop over OpenAI's Responses API.

Three designs of the loop run side by side on the same workloads: the suspended Response over
WebSocket (v1, the overnight prototype), `previous_response_id` chaining over WebSocket with a
connection-local cache (v2, what shipped), and HTTP with SSE (the baseline).

Layers, lower never importing upper: protocol (sans-IO) < engine < api < designs < server;
client, workload, netem and metrics beside them.
"""
