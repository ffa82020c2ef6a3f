"""PyTorch artifacts beside a model's ONNX file: TorchScript (`model.pt`, JIT) and an
exported program (`model.pt2`, `torch.export`), both byte-reproducible.

Two things make torch's archives differ from build to build, and both are undone here:
every archive holds `.data/serialization_id`, a random number written by torch's zip
writer, which is replaced by one derived from the archive's other bytes; and TorchScript
mangles class names (`___torch_mangle_N`) with a counter that grows with every module
scripted or traced in the process and that only a new process starts again (builders.py
builds these models each in a fresh interpreter). Two more make them differ from checkout to
checkout: TorchScript's `.debug_pkl` records and the exported graph's stack traces hold
absolute source paths; both are dropped. Zip timestamps are fixed (1980-01-01), as torch's.
"""

from __future__ import annotations

import hashlib
import struct
import zipfile
from pathlib import Path

TORCHSCRIPT_FILE = "model.pt"
EXPORTED_FILE = "model.pt2"
_ID_ENTRY = ".data/serialization_id"
_CENTRAL = b"PK\x01\x02"
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # torch's own: no build time in the archive


def write_torch_artifacts(
    module, example: tuple, folder: Path, dynamic: list[dict[int, str]], max_batch: int
) -> list[Path]:
    """Trace `module` on `example` into TorchScript and export it with the dynamic axes
    `dynamic` (one {axis: name} per input; axes of one name are one dimension)."""
    import torch

    module.eval()
    with torch.no_grad():
        traced = torch.jit.trace(module, example, check_trace=False)
    script = folder / TORCHSCRIPT_FILE
    torch.jit.save(traced, str(script))
    drop_debug_records(script)
    dims: dict[str, torch.export.Dim] = {}

    def dim(name: str):
        if name not in dims:
            bound = {"max": max_batch} if name == "N" and max_batch > 0 else {}
            dims[name] = torch.export.Dim(name, min=1, **bound)
        return dims[name]

    shapes = tuple({axis: dim(name) for axis, name in axes.items()} or None for axes in dynamic)
    with torch.no_grad():
        program = torch.export.export(module, example, dynamic_shapes=shapes)
    for node in program.graph_module.graph.nodes:
        node.meta.pop("stack_trace", None)  # source paths of this checkout
    exported = folder / EXPORTED_FILE
    torch.export.save(program, str(exported))
    for path in (script, exported):
        pin_serialization_id(path)
    return [script, exported]


def drop_debug_records(path: Path) -> None:
    """Rewrite a TorchScript archive without its `.debug_pkl` records: they hold source
    ranges with absolute paths (the checkout's, the venv's), and loading never needs them."""
    with zipfile.ZipFile(path) as archive:
        records = [(i.filename, archive.read(i)) for i in archive.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in records:
            if not name.endswith(".debug_pkl"):
                archive.writestr(zipfile.ZipInfo(name, date_time=_ZIP_EPOCH), data)


def pin_serialization_id(path: Path) -> None:
    """Replace the archive's random serialization id, in place and of the same length, by
    digits of the sha256 of the archive's other entries; CRCs updated to match."""
    data = bytearray(path.read_bytes())
    content = hashlib.sha256()
    with zipfile.ZipFile(path) as archive:
        entries = [i for i in archive.infolist() if i.filename.endswith(_ID_ENTRY)]
        for info in archive.infolist():
            if info not in entries:
                content.update(info.filename.encode() + b"\0" + archive.read(info))
    for info in entries:
        name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
        start = info.header_offset + 30 + name_len + extra_len
        size = info.file_size
        digits = str(int(content.hexdigest(), 16)).zfill(size)[:size].encode()
        data[start : start + size] = digits
        crc = zipfile.crc32(digits)
        _set_crcs(data, info, start + size, crc)
    path.write_bytes(bytes(data))


def _set_crcs(data: bytearray, info: zipfile.ZipInfo, data_end: int, crc: int) -> None:
    """The CRC sits in the local header, in the data descriptor when flag bit 3 is set, and
    in the central directory entry."""
    if struct.unpack_from("<I", data, info.header_offset + 14)[0]:
        struct.pack_into("<I", data, info.header_offset + 14, crc)
    if info.flag_bits & 0x08:
        at = data_end + (4 if data[data_end : data_end + 4] == b"PK\x07\x08" else 0)
        struct.pack_into("<I", data, at, crc)
    name = info.filename.encode()
    at = data.find(_CENTRAL)
    while at >= 0:
        if data[at + 46 : at + 46 + len(name)] == name:
            struct.pack_into("<I", data, at + 16, crc)
            return
        at = data.find(_CENTRAL, at + 4)
    raise ValueError(f"{info.filename}: no central directory entry")
