"""The Kubernetes operator for `AgentServingDeployment` (group agentserve.dev).

- `spec`: the spec as one pydantic model, the single source of the CRD (`crd`).
- `build`: spec → Kubernetes objects, a pure function (`agentserve manifests` prints them).
- `reconcile`: desired vs observed → actions and status, pure.
- `handlers`: the kopf handlers (thin), over the API boundary in `cluster`.

`kopf run -m agentserve.operator` imports this package with kopf already loaded, and then the
handlers are registered. Other importers (the CLI's `crd` and `manifests`, tests of the pure code)
do not pay for importing kopf and the kubernetes client: they import the modules they need.
"""

from __future__ import annotations

import sys

if "kopf" in sys.modules:  # started by `kopf run -m agentserve.operator`
    from agentserve.operator import handlers as handlers
