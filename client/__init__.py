"""sonicsite.client: the worker library.

SoA layouts, tensor specs checked against the model, copy plans (0 copies where the layout
allows, one gather at most), transports (hand-framed gRPC, HTTP binary, system and CUDA
shared memory), and the async engine with retries, back-off and failover.
"""

from .cuda import CudaUnavailable
from .engine import Stream
from .errors import InferError
from .layout import Column, Columns, LayoutError, Ragged, SoA
from .plan import CopyPlan, CopyRefused, make_plan
from .session import Client
from .spec import ModelInfo, SpecError, TensorSpec
from .stream_io import StreamResult
from .stream_options import StreamOptions

__all__ = [
    "Client",
    "Column",
    "Columns",
    "CopyPlan",
    "CopyRefused",
    "CudaUnavailable",
    "InferError",
    "LayoutError",
    "ModelInfo",
    "Ragged",
    "SoA",
    "SpecError",
    "Stream",
    "StreamOptions",
    "StreamResult",
    "TensorSpec",
    "make_plan",
]
