"""CUDA shared memory: device buffers registered with the servers through CUDA IPC.

The same transport as system shared memory (shm.py), with regions in GPU memory: inputs are
copied host-to-device into a pooled region (one copy; a gather first when the layout needs
one), the server reads them there, writes outputs into another region, and they are copied
back into their SoA columns. The CUDA runtime is loaded with ctypes (libcudart from the
environment, the nvidia-cuda-runtime wheel or the Triton wheel's copy); without a usable
device the transport refuses to start and says why.
"""

from __future__ import annotations

import base64
import ctypes
import glob
import os
import sysconfig
import uuid
from dataclasses import dataclass

import numpy as np

from .plan import InputPlan
from .shm import RegionPool, Slot
from .transport_grpc import GrpcTransport, Placement

HOST_TO_DEVICE, DEVICE_TO_HOST = 1, 2
IPC_HANDLE_BYTES = 64
CUDART_ENV = "SONICSITE_CUDART"  # an explicit path to libcudart.so.12


class CudaUnavailable(RuntimeError):
    """No CUDA runtime or no device: the message says which and how it was looked for."""


def _candidates() -> list[str]:
    site = sysconfig.get_paths()["purelib"]
    return [
        *([os.environ[CUDART_ENV]] if os.environ.get(CUDART_ENV) else []),
        "libcudart.so.12",
        "libcudart.so",
        *sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so.*"))),
        *sorted(glob.glob(os.path.join(site, "nvidia_pytriton.libs", "libcudart-*.so.12*"))),
    ]


def _runtime_library() -> ctypes.CDLL:
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            tried.append(f"{path}: {exc}")
            continue
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        return lib
    raise CudaUnavailable("CUDA shared memory: no libcudart found; tried " + "; ".join(tried))


def check_device(lib: ctypes.CDLL | None = None, device: int = 0) -> None:
    """CudaUnavailable unless `device` is there: asked once before a stream's workers start
    (`submit --transport cuda`), without making a context on it."""
    lib = lib or _runtime_library()
    count = ctypes.c_int(0)
    status = lib.cudaGetDeviceCount(ctypes.byref(count))
    if status != 0:  # 35 (no driver) or 100 (no device) on a machine without a GPU
        reason = lib.cudaGetErrorString(status).decode()
        raise CudaUnavailable(
            f"CUDA shared memory: no usable GPU here (cudaGetDeviceCount: {reason}, {status})"
        )
    if device >= count.value:
        raise CudaUnavailable(
            f"CUDA shared memory: device {device} requested, {count.value} present"
        )


@dataclass
class CudaRuntime:
    """The few CUDA runtime calls the transport needs, on one device."""

    device: int = 0

    def __post_init__(self) -> None:
        self._lib = _runtime_library()
        check_device(self._lib, self.device)
        self._check(self._lib.cudaSetDevice(self.device), "cudaSetDevice")

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            reason = self._lib.cudaGetErrorString(status).decode()
            raise CudaUnavailable(f"CUDA shared memory: {call} failed: {reason} ({status})")

    def malloc(self, size: int) -> int:
        self._lib.cudaSetDevice(self.device)  # the calling thread's device
        pointer = ctypes.c_void_p()
        self._check(self._lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(size)), "malloc")
        return int(pointer.value)

    def free(self, pointer: int) -> None:
        self._lib.cudaFree(ctypes.c_void_p(pointer))

    def ipc_handle(self, pointer: int) -> bytes:
        handle = ctypes.create_string_buffer(IPC_HANDLE_BYTES)
        status = self._lib.cudaIpcGetMemHandle(handle, ctypes.c_void_p(pointer))
        self._check(status, "cudaIpcGetMemHandle")
        return handle.raw

    def copy(self, destination: int, source: int, size: int, kind: int) -> None:
        self._lib.cudaSetDevice(self.device)
        status = self._lib.cudaMemcpy(
            ctypes.c_void_p(destination), ctypes.c_void_p(source), ctypes.c_size_t(size), kind
        )
        self._check(status, "cudaMemcpy")


class CudaRegion:
    """One device buffer, shared with the servers through its IPC handle."""

    def __init__(self, runtime: CudaRuntime, size: int):
        self.runtime = runtime
        self.name = f"sonicsite_cuda_{os.getpid()}_{uuid.uuid4().hex[:12]}"
        self.size = size
        self.pointer = runtime.malloc(size)
        self.handle = runtime.ipc_handle(self.pointer)

    def close(self) -> None:
        if self.pointer:
            self.runtime.free(self.pointer)
            self.pointer = 0


class CudaRegionPool(RegionPool):
    """Device regions registered with every given server, reused across requests (the
    system pool's bookkeeping). Columns live in host memory, so nothing is ever found in
    place: every tensor is staged."""

    device_memory = True

    def __init__(self, transports: list[GrpcTransport], slot_bytes: int = 1 << 22, device=0):
        self.runtime = CudaRuntime(device)
        super().__init__(transports, slot_bytes)

    def _make_region(self, size: int) -> CudaRegion:
        return CudaRegion(self.runtime, size)

    def _register(self, t: GrpcTransport, region: CudaRegion) -> None:
        handle = base64.b64encode(region.handle)
        t.control.register_cuda_shared_memory(
            region.name,
            handle,
            self.runtime.device,
            region.size,
            client_timeout=self.control_timeout_s,
        )

    def _unregister(self, t: GrpcTransport, region: CudaRegion) -> None:
        t.control.unregister_cuda_shared_memory(region.name, client_timeout=self.control_timeout_s)

    def locate(self, view: np.ndarray) -> Placement | None:
        return None  # host columns are never in device memory

    def write(self, slot: Slot, i: InputPlan) -> int:
        """Stage one input in the slot; returns the payload copies made (H2D, and a gather)."""
        if i.gather is not None:
            host = np.empty(i.nbytes, dtype=np.uint8)
            i.gather(host)
            self.runtime.copy(slot.region.pointer, host.ctypes.data, i.nbytes, HOST_TO_DEVICE)
            return 2
        offset = 0
        for piece in i.pieces:
            destination = slot.region.pointer + offset
            self.runtime.copy(destination, piece.ctypes.data, piece.nbytes, HOST_TO_DEVICE)
            offset += piece.nbytes
        return 1

    def read(self, slot: Slot, out: np.ndarray) -> None:
        """Copy the slot's first `out.nbytes` bytes into the host array `out`."""
        self.runtime.copy(out.ctypes.data, slot.region.pointer, out.nbytes, DEVICE_TO_HOST)
