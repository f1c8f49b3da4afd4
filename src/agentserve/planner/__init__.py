"""The planner: how many workers hold the TTFT and ITL targets for the load an agent fleet sees.

`predict` turns the demand and a candidate worker count into TTFT and ITL through the engine's timing
model (an engine profile); `decide` picks the count from a history of samples — KV held for sessions
in tool gaps included — with scale-down hysteresis, and says why. Both are pure: the loop that reads
metrics and scales workers is an edge around them.
"""
