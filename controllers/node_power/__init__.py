"""The node power controller: consolidate, power off what is empty, wake it when pods need it.

`python -m controllers.node_power` runs it (`--help`; dry run unless `--apply`). The package,
in the order a round runs:

- `kube`: Nodes, Pods and PodDisruptionBudgets cached by list + watch; the few writes
  (annotate and cordon, evict, fresh pod lists); which API failures are expected;
- `views`: Kubernetes objects -> the policy's views (power state, managed or why not, pods
  with their eviction blockers, pending pods, arrival rate, since when a node can have been
  unneeded by the evidence the cluster holds);
- `idle_power`: each node's predicted idle watts from the model bundle;
- `policy` (pure, shared with the energy simulation): which nodes to wake, drain, power off;
- `actuator`: cordon, drain through the Eviction API, power off or on through a driver,
  record the state on the node; give up, uncordon and back off on failure;
- `drivers`: Redfish (sushy), IPMI (pyghmi), dry-run; BMC credentials from a mounted Secret;
- `lease`: leader election on a Lease, so that two replicas never act at once; released on
  SIGTERM and Ctrl-C so that the other replica takes over at once;
- `controller`: one round (read, decide, act, report) and the loop;
- `metrics`, `health`: `power_aware_node_power_*` metrics, /healthz /readyz /metrics /status;
- `cli`: flags -> settings -> rounds.
"""
