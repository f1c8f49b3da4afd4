"""Constrained decoding: a request's constraint as grammar source (`build`), the data sent with the
request (`spec.Constraint`), and the llguidance edge that compiles, caches and masks (`engine`)."""

from agentserve.constraints.spec import Constraint

__all__ = ["Constraint"]
