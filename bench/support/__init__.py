"""Helpers the benchmarks run on (the tests use them too; a benchmark never imports tests).

- `server`: the extender under a real uvicorn, in a thread or as `python -m extender`;
- `bundles`: ONNX models of known power curves, manifest edits, kubelet's ConfigMap mount;
- `prometheus`: a real Prometheus server, backfilled with promtool from OpenMetrics text.
"""
