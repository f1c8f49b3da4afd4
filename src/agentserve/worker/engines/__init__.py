"""Inference engines behind the `Engine` protocol: `sim` (no GPU) and `trtllm` (TensorRT-LLM)."""
