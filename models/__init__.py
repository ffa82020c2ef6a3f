"""The model repository: one folder per model with the `config.pbtxt` that production Triton
serves with its onnxruntime backend, plus deterministic builders of the ONNX files."""
