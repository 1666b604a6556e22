"""The shared lower layer: contracts and live-data readers that training, the extender and the
controllers all use.

Nothing here imports `training`, `predictor`, `extender`, `controllers` or `bench`; they import
this. What lives here:

- `metrics_table`: contract 1, the collected-metrics table's column names and `FEATURES`,
  defined once (`cpu_util` and friends).
- `collect_config`: the collect settings (queries, sensor-name rules, instance-to-node mapping,
  durations and times), loaded from YAML/JSON.
- `prometheus`: the Prometheus reader (bounded time, `CollectError` naming what failed) and its
  answers as numpy `Series`.
- `node_mapping`: which node and which contract column each series feeds.
- `instant`: every node's telemetry at one instant, as plain readings (the extender's poller).
- `labels`: contract 4, the node labels and annotations users set or read (energy bands,
  power cap, power state, ...), defined once;
- `logs`: the logging set-up of every process we run (JSON lines or text).
"""
