"""Which file a model is served from. Every model has its ONNX file (Triton's onnxruntime
backend); those built from PyTorch also have a TorchScript file (`model.pt`, Triton's PyTorch
backend), served with `pytorch`. Here, apart from the repository code, so that the command
line can offer the choice without importing protobuf."""

from __future__ import annotations

ONNX, PYTORCH = "onnx", "pytorch"
FRAMEWORKS = (ONNX, PYTORCH)
