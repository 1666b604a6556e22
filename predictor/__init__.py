"""Predictor: load an ONNX model bundle and answer how many watts a node draws at utilisation u."""
