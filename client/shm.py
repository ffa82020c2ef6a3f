"""System shared memory: regions in /dev/shm, a pool of them registered with the servers,
and the transport that sends requests whose tensors already live there.

A SoA allocated in a pool slot is read by the server where it is (0 payload copies), and
outputs mapped to SoA columns in a slot are written there by the server (0 copies back).
Shared memory needs a server on the same machine, reached directly, not through a balancer.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
import threading
import uuid
import weakref
from dataclasses import dataclass

import numpy as np
from tritonclient.utils import InferenceServerException

from .errors import INTERNAL, INVALID, TIMEOUT, InferError
from .layout import contiguous_bytes
from .plan import CopyPlan, CopyRefused, InputPlan
from .spec import TRITON_DTYPES
from .transport_grpc import CONTROL_TIMEOUT_S, GrpcTransport, Placement, Reply
from .wire import OutputTensor

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"


class Region:
    """One POSIX shared-memory region, mapped into this process."""

    def __init__(self, size: int, prefix: str = "sonicsite_client"):
        self.name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:12]}"
        self.key = "/" + self.name
        self.size = size
        fd = os.open(os.path.join(SHM_DIR, self.name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        # Unlinked even if the owner never calls close (an exception, interpreter exit).
        self._finalizer = weakref.finalize(self, _unlink, os.path.join(SHM_DIR, self.name))

    def offset_of(self, view: np.ndarray) -> int | None:
        start = view.ctypes.data - self.array.ctypes.data
        return start if start >= 0 and start + view.nbytes <= self.size else None

    def close(self) -> None:
        """Unlink the region; the mapping goes when the last view of it does."""
        self.array = None
        with contextlib.suppress(BufferError):
            self._map.close()
        self._finalizer()


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@dataclass
class Slot:
    region: Region

    @property
    def buffer(self) -> np.ndarray:
        return self.region.array


class RegionPool:
    """Regions registered with every given server, handed out and reused across requests."""

    device_memory = False  # host memory: a SoA can live in a slot and be read in place

    def __init__(
        self,
        transports: list[GrpcTransport],
        slot_bytes: int = 1 << 20,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
    ):
        """`control_timeout_s`: how long one server may take to register or unregister a
        region (a hung server must not hang the client)."""
        self.transports = transports
        self.slot_bytes = slot_bytes
        self.control_timeout_s = control_timeout_s
        self._free: list[Slot] = []
        self._all: list[Region] = []
        self._lock = threading.Lock()

    # What differs between system and CUDA shared memory (cuda.CudaRegionPool overrides it)
    def _make_region(self, size: int) -> Region:
        return Region(size)

    def _register(self, t: GrpcTransport, region: Region) -> None:
        t.control.register_system_shared_memory(
            region.name, region.key, region.size, client_timeout=self.control_timeout_s
        )

    def _unregister(self, t: GrpcTransport, region: Region) -> None:
        t.control.unregister_system_shared_memory(
            region.name, client_timeout=self.control_timeout_s
        )

    def _new_region(self, size: int) -> Region:
        """A region registered with every server, or none: a server that refuses it has it
        unregistered from those that took it, and the error says what kind of failure it
        was (unreachable or timed out: retried elsewhere; refused: not)."""
        region = self._make_region(size)
        taken: list[GrpcTransport] = []
        for t in self.transports:
            try:
                self._register(t, region)
            except Exception as exc:
                failed = _control_error(t, exc)
                # a server that timed out may have taken it all the same
                undone = self._undo(region, taken + ([t] if failed.kind == TIMEOUT else []))
                region.close()
                raise InferError(
                    failed.kind,
                    f"cannot register shared memory region {region.name} ({size} B) on "
                    f"{t.server}: {failed.message}; {undone}",
                    t.server,
                    status=failed.status,
                ) from exc
            taken.append(t)
        with self._lock:
            self._all.append(region)
        return region

    def _undo(self, region: Region, taken: list[GrpcTransport]) -> str:
        """Unregister `region` from the servers that took it; says how that went."""
        if not taken:
            return "no server had taken it"
        kept = []
        for t in taken:
            try:
                self._unregister(t, region)
            except Exception as exc:
                kept.append(f"{t.server} ({_control_error(t, exc).message})")
        if kept:
            log.warning("shared memory: %s kept by %s until restarted", region.name, kept)
            return f"still registered on {', '.join(kept)} until it restarts"
        return f"unregistered from the {len(taken)} server(s) that had taken it"

    def acquire(self, nbytes: int) -> Slot:
        """A free slot of at least `nbytes`, else a new region: registered outside the
        lock, so that one slow server does not hold every other request's slot back."""
        with self._lock:
            for k, slot in enumerate(self._free):
                if slot.region.size >= nbytes:
                    return self._free.pop(k)
        return Slot(self._new_region(max(nbytes, self.slot_bytes)))

    def release(self, slot: Slot) -> None:
        with self._lock:
            self._free.append(slot)

    def write(self, slot: Slot, i: InputPlan) -> int:
        """Stage one input that is not in a region; returns the payload copies (1)."""
        target = slot.buffer[: i.nbytes]
        if i.gather is not None:
            i.gather(target)
        else:
            np.concatenate(i.pieces, out=target)
        return 1

    def read(self, slot: Slot, out: np.ndarray) -> None:
        out[...] = slot.buffer[: out.nbytes]

    def locate(self, view: np.ndarray) -> Placement | None:
        for region in self._all:
            offset = region.offset_of(view)
            if offset is not None:
                return Placement(region.name, offset, view.nbytes)
        return None

    def close(self) -> None:
        """Unregister every region from every server, then free them. A server that cannot
        be reached keeps its registrations until it restarts: a warning per server says so."""
        failed: dict[str, list[str]] = {}
        for region, t in itertools.product(self._all, self.transports):
            try:
                self._unregister(t, region)
            except Exception as exc:
                reason = _control_error(t, exc).message
                failed.setdefault(t.server, []).append(f"{region.name}: {reason}")
        for server, reasons in failed.items():
            log.warning(
                "shared memory: %d region(s) not unregistered on %s, which keeps them until it "
                "restarts (first: %s)",
                len(reasons),
                server,
                reasons[0],
            )
        for region in self._all:
            region.close()
        self._all.clear()
        self._free.clear()


def _control_error(t: GrpcTransport, exc: Exception) -> InferError:
    """A shared-memory control call's failure as an InferError: a server unreachable or
    out of time is UNAVAILABLE or TIMEOUT (the request goes elsewhere), one that refused
    the region INVALID (a server that is not co-located cannot map it: so would a retry)."""
    if not isinstance(exc, InferenceServerException):
        return InferError(INTERNAL, f"{type(exc).__name__}: {exc}", t.server)
    status = str(exc.status())
    if "UNAVAILABLE" in status or "DEADLINE_EXCEEDED" in status:
        return t.control_error(exc)  # which also drops the channel to an unreachable one
    return InferError(INVALID, exc.message() or str(exc), t.server, status=status)


class ShmTransport:
    """gRPC for the request header; every tensor in a registered region: system shared
    memory (RegionPool) or CUDA device memory (cuda.CudaRegionPool), by the same steps."""

    kind = "shm"

    def __init__(self, transport: GrpcTransport, pool, strict: bool = False):
        self.grpc = transport
        self.pool = pool
        self.strict = strict
        self.server = transport.server

    def model_info(self, model: str, timeout: float = CONTROL_TIMEOUT_S):
        return self.grpc.model_info(model, timeout)

    def statistics(self, model: str, timeout: float = CONTROL_TIMEOUT_S):
        return self.grpc.statistics(model, timeout)

    def infer(
        self,
        plan: CopyPlan,
        timeout: float,
        placements=None,
        request_id: str = "",
        parameters: dict | None = None,
    ) -> Reply:
        placements: dict[str, Placement] = {}
        staged = []
        readback = []  # outputs the server writes into a staged slot, copied back after
        copies = 0
        try:
            for i in plan.inputs:
                view = i.contiguous() if i.gather is None else None
                placed = self.pool.locate(view) if view is not None else None
                if placed is None:
                    if self.strict or plan.strict:  # the stream's strict=True, or the client's
                        raise CopyRefused(
                            f"strict: input {i.name!r} is not in a registered "
                            f"shared-memory region ({i.reason})"
                        )
                    slot = self.pool.acquire(i.nbytes)
                    staged.append(slot)
                    copies += self.pool.write(slot, i)
                    placed = Placement(slot.region.name, 0, i.nbytes)
                placements[i.name] = placed
            for o in plan.outputs:
                view = contiguous_bytes(o.targets) if o.targets else None
                placed = self.pool.locate(view) if view is not None else None
                if placed is None and o.targets and self.pool.device_memory:
                    nbytes = sum(t.nbytes for t in o.targets)
                    slot = self.pool.acquire(nbytes)
                    staged.append(slot)
                    readback.append((o.name, slot, view, nbytes))
                    placed = Placement(slot.region.name, 0, nbytes)
                if placed is not None:
                    placements[o.name] = placed
            reply = self.grpc.infer(plan, timeout, placements, request_id, parameters)
            for name, slot, view, nbytes in readback:
                header = reply.outputs[name]
                if view is not None:  # straight into the SoA column; the engine skips it
                    self.pool.read(slot, view)
                elif isinstance(header, OutputTensor):  # into an array the engine delivers
                    host = np.empty(nbytes, dtype=np.uint8)
                    self.pool.read(slot, host)
                    dtype = np.dtype(TRITON_DTYPES[header.datatype])
                    reply.outputs[name] = host.view(dtype).reshape(header.shape)
                copies += 1
        finally:
            for slot in staged:
                self.pool.release(slot)
        reply.copies = copies
        return reply

    def close(self) -> None:
        self.grpc.close()
