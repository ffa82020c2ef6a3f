"""The operator's placement options and where a local site keeps what placement reads:
its repository (the catalogue), its servers' PIDs (footprints by resident memory) and its
administrative key (model control is a restricted protocol)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sonicsite.contract.wire import ADMIN_KEY_FILE, HOLD_DEADLINE_S, load_state_file

from .catalogue import (
    DEFAULT_POOL,
    Budget,
    Catalogue,
    ModelInfo,
    Pool,
    catalogue_of,
    read_repository,
)
from .placement_state import PlacementPolicy

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlacementSettings:
    """The operator's placement options (`--placement` and the options after it)."""

    idle_unload_s: float = PlacementPolicy.idle_unload_s
    budget_models: int | None = None  # models per server; None: no limit by count
    queue_ms: float = 100.0  # queue time per request over which a model wants a replica
    pressure_s: float = PlacementPolicy.pressure_s
    evict_idle_s: float = PlacementPolicy.evict_idle_s
    min_resident_s: float = PlacementPolicy.min_resident_s
    keep_warm: bool = PlacementPolicy.keep_warm  # a model's last replica stays while room allows
    hold_deadline_s: float = HOLD_DEADLINE_S  # a held request's deadline, by default
    hold_deadlines: tuple[tuple[str, float], ...] = ()  # (model, deadline s) where not
    # (pool, models pinned to it; () for the pool of every model no other pool names);
    # none given: one pool, "default", of every server and every model
    pools: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def policy(self) -> PlacementPolicy:
        return PlacementPolicy(
            idle_unload_s=self.idle_unload_s,
            evict_idle_s=self.evict_idle_s,
            min_resident_s=self.min_resident_s,
            pressure_s=self.pressure_s,
            keep_warm=self.keep_warm,
        )

    def args(self) -> list[str]:
        """The operator's command-line options for these settings."""
        args = [
            "--placement",
            f"--idle-unload-s={self.idle_unload_s}",
            f"--placement-queue-ms={self.queue_ms}",
            f"--placement-pressure-s={self.pressure_s}",
            f"--evict-idle-s={self.evict_idle_s}",
            f"--min-resident-s={self.min_resident_s}",
            f"--hold-deadline-s={self.hold_deadline_s}",
            *(f"--hold-deadline-s={m}={s}" for m, s in self.hold_deadlines),
        ]
        if self.keep_warm:
            args.append("--keep-warm")
        if self.budget_models is not None:
            args.append(f"--budget-models={self.budget_models}")
        args += [
            f"--pool={name}={','.join(models)}" if models else f"--pool={name}"
            for name, models in self.pools
        ]
        return args

    def catalogue_pools(self) -> tuple[Pool, ...]:
        """The catalogue's pools, each with the budget per server."""
        budget = Budget(models=self.budget_models)
        pools = self.pools or ((DEFAULT_POOL, ()),)
        return tuple(Pool(name, tuple(models), budget) for name, models in pools)


def local_pids(site_dir: Path) -> dict[str, int]:
    """Server id -> PID from a local site's state file (for footprints by resident memory),
    read by the contract's one reader; {} when it cannot be, logged with why (footprints are
    then Triton's reported memory alone, or none)."""
    try:
        data, _ = load_state_file(Path(site_dir))
    except (OSError, ValueError) as exc:  # names the file and what is wrong with it
        LOG.warning("server PIDs unread, no footprints by resident memory: %s", exc)
        return {}
    return {s["id"]: s["pid"] for s in data["servers"] if s.get("pid")}


def local_catalogue(site_dir: Path, settings: PlacementSettings) -> Catalogue:
    """The local site's catalogue: its repository, its pools, the budget per server."""
    models = read_repository(Path(site_dir) / "repository")
    return catalogue_of(models, settings.catalogue_pools())


def named_catalogue(names: list[str], settings: PlacementSettings) -> Catalogue:
    """A catalogue from model names alone (on Kubernetes the operator mounts no
    repository): its pools, the budget per server; footprints measured at load."""
    if not names:
        raise ValueError("expected the catalogue's models (--models a,b)")
    return catalogue_of([ModelInfo(n) for n in names], settings.catalogue_pools())


def read_admin_key(site_dir: Path) -> str:
    return (Path(site_dir) / ADMIN_KEY_FILE).read_text().strip()
