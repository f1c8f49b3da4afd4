"""`agentserve profile`: measure a running worker, fit a timing model, write an engine profile.

`plan` says what to measure (pure), `measure` measures it through the worker API (I/O), `fit` fits
the timing model (pure, `nnls` underneath), `report` shows measured against modelled. The profile
format is `agentserve.worker.profiles`.
"""
