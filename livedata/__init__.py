"""The shared lower layer: contracts and live-data readers that training, the extender and the
controllers all use.

Nothing here imports `training`, `predictor`, `extender`, `controllers` or `bench`; they import
this. What lives here:

- `metrics_table`: contract 1, the collected-metrics table's column names and `FEATURES`,
  defined once (`cpu_util` and friends).
- `labels`: contract 4, the node labels and annotations users set or read (energy bands,
  power cap, power state, ...), defined once.
"""
