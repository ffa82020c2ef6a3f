"""The site's model catalogue: every model its repositories hold, each one's footprint, the
pools that serve them and each server's budget.

Placement (placement.py) reads it and never changes it; a footprint is measured when a model
is loaded (model_control.py) and remembered here with `with_footprint`, so that the next
decision knows what a model costs before loading it again. A model never measured counts as
the largest footprint measured so far (or `default_footprint_bytes` before any), so that a
first load does not overfill a budget by guessing small.

A pool is a set of servers (a device kind, or the servers given some models) with one
budget per server; a model belongs to one pool: the pool that names it, else the pool that
names none. A server's own budget, where given, replaces its pool's.

The repository reader takes what placement needs from each `config.pbtxt` (Triton's text
format, read here with a small scanner: the operator carries no protobuf) and the versions
on disk; the same catalogue can be made from a server's repository index
(`model_control.repository_index`) where the operator does not mount the repository.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sonicsite.contract.wire import DEFAULT_POOL

DEFAULT_FOOTPRINT_BYTES = 512 * 2**20  # assumed for a model before any has been measured
CONFIG_FILE = "config.pbtxt"


class CatalogueError(ValueError):
    """A catalogue that cannot be placed from, or a model config that cannot be read; the
    message names the model, pool or file and the field."""


@dataclass(frozen=True)
class Footprint:
    """What a loaded model costs its server, as measured when it was loaded."""

    bytes: int
    source: str  # how it was measured (model_control.py: "triton-statistics", "process-rss")
    measured_at: float  # epoch seconds
    server: str = ""  # where it was measured


@dataclass(frozen=True)
class ModelInfo:
    """One model of the repository."""

    name: str
    versions: tuple[int, ...] = ()  # on disk; empty: not known (read from an index)
    instances: int = 1  # model instances per replica (a CPU thread each, locally)
    max_batch_size: int = 0
    footprint: Footprint | None = None  # None until first measured


@dataclass(frozen=True)
class Budget:
    """What one server may hold: bytes of model footprints, and a number of models; None
    where unlimited. One server stands for one device."""

    memory_bytes: int | None = None
    models: int | None = None

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "models"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise CatalogueError(f"budget {name}: expected at least 1 or None, got {value}")


@dataclass(frozen=True)
class Pool:
    """Servers that serve the same models under the same budget per server. `models`: the
    models placed in this pool; empty: every model that no other pool names."""

    name: str
    models: tuple[str, ...] = ()
    budget: Budget = field(default_factory=Budget)


@dataclass(frozen=True)
class Catalogue:
    models: Mapping[str, ModelInfo]
    pools: tuple[Pool, ...] = (Pool(DEFAULT_POOL),)
    budgets: Mapping[str, Budget] = field(default_factory=dict)  # per server id: overrides
    default_footprint_bytes: int = DEFAULT_FOOTPRINT_BYTES

    def __post_init__(self) -> None:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise CatalogueError(f"pools: names must be distinct, got {names}")
        catch_all = [p.name for p in self.pools if not p.models]
        if len(catch_all) > 1:
            raise CatalogueError(f"pools: at most one pool names no models, got {catch_all}")
        owner: dict[str, str] = {}
        for pool in self.pools:
            for model in pool.models:
                if model not in self.models:
                    raise CatalogueError(
                        f"pool {pool.name!r}: model {model!r} is not in the catalogue "
                        f"{sorted(self.models)}"
                    )
                if model in owner:
                    raise CatalogueError(
                        f"model {model!r}: in pools {owner[model]!r} and {pool.name!r}; "
                        "expected one"
                    )
                owner[model] = pool.name
        if not catch_all and (homeless := sorted(set(self.models) - set(owner))):
            raise CatalogueError(f"models {homeless}: in no pool, and no pool takes the others")

    def pool_of(self, model: str) -> str:
        """The pool whose servers serve `model`."""
        for pool in self.pools:
            if model in pool.models:
                return pool.name
        return next(p.name for p in self.pools if not p.models)

    def budget(self, server: str, pool: str) -> Budget:
        """The server's own budget, else its pool's."""
        if server in self.budgets:
            return self.budgets[server]
        return next((p.budget for p in self.pools if p.name == pool), Budget())

    def footprint_bytes(self, model: str) -> int:
        """The model's measured footprint; a model not measured yet counts as the largest
        measured one (or the default before any): never guess a model small."""
        info = self.models.get(model)
        if info is not None and info.footprint is not None:
            return info.footprint.bytes
        measured = [m.footprint.bytes for m in self.models.values() if m.footprint is not None]
        return max(measured, default=self.default_footprint_bytes)

    def with_footprint(self, model: str, footprint: Footprint) -> Catalogue:
        """The catalogue remembering `model`'s footprint (the latest measure replaces an
        earlier one: a model's cost can change with its version or its instances)."""
        if model not in self.models:
            raise CatalogueError(f"model {model!r}: not in the catalogue {sorted(self.models)}")
        models = dict(self.models)
        models[model] = replace(models[model], footprint=footprint)
        return replace(self, models=models)

    def to_dict(self) -> dict[str, Any]:
        return {
            "models": {
                name: {
                    "versions": list(m.versions),
                    "instances": m.instances,
                    "max_batch_size": m.max_batch_size,
                    "footprint": None if m.footprint is None else vars(m.footprint).copy(),
                }
                for name, m in sorted(self.models.items())
            },
            "pools": [
                {"name": p.name, "models": list(p.models), "budget": vars(p.budget).copy()}
                for p in self.pools
            ],
            "budgets": {s: vars(b).copy() for s, b in sorted(self.budgets.items())},
            "default_footprint_bytes": self.default_footprint_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Catalogue:
        models = {
            name: ModelInfo(
                name,
                tuple(m.get("versions", ())),
                m.get("instances", 1),
                m.get("max_batch_size", 0),
                Footprint(**m["footprint"]) if m.get("footprint") else None,
            )
            for name, m in data["models"].items()
        }
        pools = tuple(
            Pool(p["name"], tuple(p.get("models", ())), Budget(**p.get("budget", {})))
            for p in data.get("pools", [{"name": DEFAULT_POOL}])
        )
        budgets = {s: Budget(**b) for s, b in data.get("budgets", {}).items()}
        default = data.get("default_footprint_bytes", DEFAULT_FOOTPRINT_BYTES)
        return cls(models, pools, budgets, default)


def catalogue_of(
    models: Iterable[ModelInfo],
    pools: tuple[Pool, ...] = (Pool(DEFAULT_POOL),),
    budgets: Mapping[str, Budget] | None = None,
) -> Catalogue:
    return Catalogue({m.name: m for m in models}, pools, dict(budgets or {}))


# -- the repository reader ------------------------------------------------------------------

_TOKEN = re.compile(
    r'\s+|#[^\n]*|"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|[{}\[\]:,;<>]|[^\s{}\[\]:,;<>"\']+'
)


def _tokens(text: str, where: Path) -> list[str]:
    tokens, at = [], 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            raise CatalogueError(f"{where}: cannot read the text at offset {at}")
        token, at = match.group(), match.end()
        if not token.isspace() and not token.startswith("#"):
            tokens.append(token)
    return tokens


def parse_text_proto(text: str, where: Path = Path("<text>")) -> dict[str, list[Any]]:
    """Protobuf's text format as {field: [values]}: a message as such a dict, a scalar as its
    text (strings unquoted); repeated fields and `[a, b]` lists both give several values."""
    tokens = _tokens(text, where)
    position = 0

    def message(closing: str | None) -> dict[str, list[Any]]:
        nonlocal position
        fields: dict[str, list[Any]] = {}
        while position < len(tokens):
            name = tokens[position]
            position += 1
            if name == closing:
                return fields
            if name in ",;":
                continue
            if position < len(tokens) and tokens[position] == ":":
                position += 1
            fields.setdefault(name, []).extend(values())
        if closing is not None:
            raise CatalogueError(f"{where}: a message is not closed ({closing!r} missing)")
        return fields

    def values() -> list[Any]:
        nonlocal position
        if position >= len(tokens):
            raise CatalogueError(f"{where}: a field has no value at the end")
        token = tokens[position]
        position += 1
        if token in ("{", "<"):
            return [message("}" if token == "{" else ">")]
        if token == "[":
            found: list[Any] = []
            while position < len(tokens) and tokens[position] != "]":
                if tokens[position] == ",":
                    position += 1
                    continue
                found.extend(values())
            position += 1
            return found
        return [token[1:-1] if token[:1] in "\"'" else token]

    return message(None)


def _integer(config: dict[str, list[Any]], name: str, default: int, where: Path) -> int:
    raw = config.get(name, [str(default)])[-1]
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise CatalogueError(f"{where}: field {name!r} is {raw!r}, expected an integer") from None


def read_model(folder: Path) -> ModelInfo:
    """One model folder of a repository: its config and its numeric version folders."""
    path = folder / CONFIG_FILE
    config = parse_text_proto(path.read_text(), path)
    name = config.get("name", [folder.name])[-1]
    if name != folder.name:
        raise CatalogueError(f"{path}: field 'name' is {name!r}, expected {folder.name!r}")
    groups = [g for g in config.get("instance_group", []) if isinstance(g, dict)]
    instances = sum(_integer(g, "count", 1, path) for g in groups) if groups else 1
    versions = tuple(sorted(int(v.name) for v in folder.iterdir() if v.name.isdigit()))
    return ModelInfo(name, versions, instances, _integer(config, "max_batch_size", 0, path))


def read_repository(repository: Path) -> list[ModelInfo]:
    """Every model of a Triton model repository (a folder per model holding a config.pbtxt),
    sorted by name; CatalogueError naming the file for a config that cannot be read."""
    repository = Path(repository)
    if not repository.is_dir():
        raise CatalogueError(f"model repository {repository}: not a folder")
    return [read_model(p.parent) for p in sorted(repository.glob(f"*/{CONFIG_FILE}"))]
