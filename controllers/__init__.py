"""Controllers: processes of their own that keep the cluster in the state the extender reads.

They run beside the request path, never on it: each reads live data (Prometheus, the Kubernetes
API) on its own schedule and writes the labels and taints that the extender's filter and scores
then read from the Node watch.

- `energy_adapter`: battery level (Prometheus) -> the `energy-status` label, with hysteresis;
- `node_power`: powers off the nodes consolidation empties and wakes them for pods;
- `probes`: what both share as pods: /healthz, /readyz, /metrics; stopping on SIGTERM and
  Ctrl-C.

Controllers import `livedata` (and may import `predictor`), never `extender`: the service and
the controllers share contracts, not code paths.
"""
