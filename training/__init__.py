"""Training: collect node metrics, fit per-node power models, export an ONNX model bundle."""
