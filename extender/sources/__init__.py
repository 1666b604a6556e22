"""Where the extender's picture of the cluster comes from; each source writes `ClusterState`.

- `kube_watch`: Node and Pod watches through the Kubernetes API (live mode): node info,
  recently bound pods;
- `telemetry`: the Prometheus poller (live mode): each node's utilisation and temperatures;
- `snapshot`: a cluster snapshot file, or the built-in demo cluster (fixed telemetry).

Plugins bring their own background sources (`Plugin.background`); these three feed every
plugin. No source runs on the request path.
"""
