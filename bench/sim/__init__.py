"""Parts of the energy simulation run by `python -m bench.energy_sim`.

- `cluster`: the simulated nodes (SPECpower-shaped power curves, temperatures, batteries);
- `workload`: the pod trace (generator and CSV loader);
- `kube_default`: kube-scheduler's default filter and scores, reimplemented from upstream;
- `policies`: default, random, oracle, and the extender over HTTP;
- `engine`: the simulation loop and per-policy results;
- `power`: power states (off, booting, shutting down) and the node power controller's policy in
  the loop; `autoscaler`: cluster-autoscaler's rule; `power_policies`: the two policies with
  power management (`default+autoscaler`, `power-aware+power-management`).
"""
