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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tritonclient.utils import InferenceServerException

from .errors import INTERNAL, INVALID, InferError, status_name
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
    """Regions of this process, each registered with a server at its first use there,
    handed out and reused across requests."""

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
        self._on: dict[str, set[str]] = {}  # server -> names of the regions registered there
        self._registering: dict[str, threading.Lock] = {}  # one registration at a time, per server
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
        """A region of this process; registered with a server when a request there first
        uses it (`ensure`)."""
        region = self._make_region(size)
        with self._lock:
            self._all.append(region)
        return region

    def ensure(self, t: GrpcTransport, names: set[str]) -> None:
        """The regions `names` registered with `t`'s server, each at its first use there: a
        server that is down stops no request to the others (registering with every server
        at once failed every request while one was down), and one that restarted (`forget`)
        is given them again. A server that refuses a region is INVALID (one that is not
        co-located cannot map it: neither could a retry); one unreachable or out of time,
        UNAVAILABLE or TIMEOUT (the request goes elsewhere)."""
        with self._lock:
            one_at_a_time = self._registering.setdefault(t.server, threading.Lock())
        with one_at_a_time:
            with self._lock:
                on = self._on.setdefault(t.server, set())
                missing = [r for r in self._all if r.name in names and r.name not in on]
            for region in missing:
                try:
                    self._register(t, region)
                except Exception as exc:
                    failed = _control_error(t, exc)
                    if "ALREADY_EXISTS" not in failed.status:  # taken by a try that timed out
                        raise InferError(
                            failed.kind,
                            f"cannot register shared memory region {region.name} "
                            f"({region.size} B) on {t.server}: {failed.message}",
                            t.server,
                            status=failed.status,
                        ) from exc
                with self._lock:
                    self._on.setdefault(t.server, set()).add(region.name)

    def forget(self, server: str) -> None:
        """`server` has lost its registrations (it restarted): each is made again at its
        next use there."""
        with self._lock:
            self._on.pop(server, None)

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
        """Unregister every region from each server it was registered with, then free them.
        A server that cannot be reached keeps its registrations until it restarts: a
        warning per server says so."""
        with self._lock:
            on = {server: set(names) for server, names in self._on.items()}
        failed: dict[str, list[str]] = {}
        for region, t in itertools.product(self._all, self.transports):
            if region.name not in on.get(t.server, ()):
                continue
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
        self._on.clear()


def staging(pool: RegionPool) -> Callable[[np.ndarray | None], str]:
    """What ShmTransport.infer copies, said before it does (make_plan's `sendable`, through
    `Client.plan`): an input's bytes that are not one range inside a registered region are
    staged into one, a payload copy the plan's report must count."""

    def sendable(view: np.ndarray | None) -> str:
        if pool.device_memory:
            return "copied into the GPU's memory: the columns are in the host's"
        if view is None:
            return "staged into a shared-memory region: its pieces go as one range"
        if pool.locate(view) is None:
            return (
                "staged into a shared-memory region: its bytes lie in none the client "
                "registered (make the columns with client.allocate)"
            )
        return ""

    return sendable


def _control_error(t: GrpcTransport, exc: Exception) -> InferError:
    """A shared-memory control call's failure as an InferError: a server unreachable or
    out of time is UNAVAILABLE or TIMEOUT (the request goes elsewhere), one that refused
    the region INVALID (a server that is not co-located cannot map it: so would a retry)."""
    if not isinstance(exc, InferenceServerException):
        return InferError(INTERNAL, f"{type(exc).__name__}: {exc}", t.server)
    status = status_name(exc)
    if status in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        return t.control_error(exc)  # which also drops the channel to an unreachable one
    return InferError(INVALID, exc.message() or str(exc), t.server, status=status)


def _region_lost(exc: InferError) -> bool:
    """The server does not know a region the request names: it restarted since it was
    registered there (Triton refuses such a request before it runs it)."""
    return "NOT_FOUND" in exc.status and "shared memory region" in str(exc)


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
            regions = {p.region for p in placements.values()}
            try:
                self.pool.ensure(self.grpc, regions)
                reply = self.grpc.infer(plan, timeout, placements, request_id, parameters)
            except InferError as exc:
                if not _region_lost(exc):
                    raise
                self.pool.forget(self.server)  # it restarted: registered again, sent again
                self.pool.ensure(self.grpc, regions)
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
