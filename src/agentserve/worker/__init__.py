"""The worker: runs an inference engine and serves it to the frontend and the router.

`engine` defines the `Engine` protocol and its values; `engines/` holds the simulated engine (the
embedded default, no GPU) and the TensorRT-LLM adapter; `service` is the HTTP + ZeroMQ edge and
`client` the typed client the frontend and router use.
"""
