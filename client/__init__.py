"""sonicsite.client: the worker library.

SoA layouts, tensor specs checked against the model, copy plans (0 copies where the layout
allows, one gather at most), transports (hand-framed gRPC, HTTP binary, system and CUDA
shared memory), and the async engine with retries, back-off and failover. The in-process
path: `Client(local=LocalModels(folder, ...))` and streams with `backend="local"` (or
`"auto"`: the site, and this process when the site does not answer; its deadlines
`AutoPolicy`); a model's metadata with no site to ask: `ModelInfo.from_config`.
"""

from .backend_auto import AutoPolicy
from .backend_local import LocalModels, LocalStream
from .cuda import CudaUnavailable
from .discovery import DiscoveryError
from .engine import Stream
from .errors import InferError
from .layout import Column, Columns, LayoutError, Ragged, SoA
from .plan import CopyPlan, CopyRefused, make_plan
from .session import Client
from .spec import ModelInfo, SpecError, TensorInfo, TensorSpec
from .stream_checks import ModelNotServed
from .stream_io import StreamResult
from .stream_options import StreamOptions

__all__ = [
    "AutoPolicy",
    "Client",
    "Column",
    "Columns",
    "CopyPlan",
    "CopyRefused",
    "CudaUnavailable",
    "DiscoveryError",
    "InferError",
    "LayoutError",
    "LocalModels",
    "LocalStream",
    "ModelInfo",
    "ModelNotServed",
    "Ragged",
    "SoA",
    "SpecError",
    "Stream",
    "StreamOptions",
    "StreamResult",
    "TensorInfo",
    "TensorSpec",
    "make_plan",
]
