"""Learning from failures: what pods did on each node, as a reward the `Reward` plugin scores.

The pod watch the extender already runs (`extender.sources.kube_watch`) hands every pod event
to a `RewardSource` (`source`), which turns successive pod states into outcomes (`outcomes`:
restarts, OOM kills, crash loops, readiness failing past a grace, Failed or Evicted pods, pods
that never start; healthy running time and completion count for the node), keeps decayed
evidence per node and per node x workload (`model`), publishes an immutable snapshot for the
request path, and saves the evidence to a ConfigMap so that it survives a restart (`store`).
`extender.plugins.reward` scores and filters from the snapshot.
"""
