"""Realistic synthetic event samples for each model, and the checks on their answers.

A worker job holds its events as arrays with a leading event axis (fixed-size models) or as
flat content plus offsets (graphs). `request(lo, hi)` gives the model inputs for events
[lo, hi); `check(lo, hi, outputs)` raises AnswerError when an answer is not plausible for
those events (wrong shape, not finite, not a probability, not the exact arithmetic).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from .models.repository import CONFIG_DIR

# Events per request that a worker sends by default: a few ms to tens of ms of server work.
DEFAULT_BATCH = {
    "simple": 8,
    "identity": 4,
    "particlenet_ak4": 16,
    "deepmet": 4,
    "particle_transformer": 8,
    "gnn_linking": 8,
}


class AnswerError(ValueError):
    """A server answer that cannot be right for the events sent."""


@dataclass
class Sample:
    """Fixed-shape events: every input array has the event axis first."""

    model: str
    inputs: dict[str, np.ndarray]
    outputs: list[str]
    expected: dict[str, np.ndarray] = field(default_factory=dict)  # exact answers, if known
    probabilities: bool = False  # each output row is a softmax

    def __len__(self) -> int:
        return next(iter(self.inputs.values())).shape[0]

    def request(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        return {name: array[lo:hi] for name, array in self.inputs.items()}

    def check(self, lo: int, hi: int, outputs: dict[str, np.ndarray]) -> None:
        for name in self.outputs:
            out = outputs.get(name)
            if out is None:
                raise AnswerError(f"{self.model}: output {name!r} missing from the answer")
            if out.shape[0] != hi - lo:
                raise AnswerError(
                    f"{self.model}: output {name!r} has {out.shape[0]} rows, expected {hi - lo}"
                )
            if out.dtype.kind == "f" and not np.all(np.isfinite(out)):
                raise AnswerError(f"{self.model}: output {name!r} has non-finite values")
            if self.probabilities:
                sums = out.sum(axis=-1)
                if np.any(out < 0) or not np.allclose(sums, 1.0, atol=1e-4):
                    raise AnswerError(f"{self.model}: output {name!r} rows are not softmax")
            if name in self.expected and not np.array_equal(out, self.expected[name][lo:hi]):
                raise AnswerError(f"{self.model}: output {name!r} differs from the exact answer")


@dataclass
class GraphSample:
    """Events as graphs of varying size: flat node and edge content plus offsets. A request
    of several events is one disjoint graph; edge indices are shifted per event."""

    model: str
    node_features: np.ndarray  # [total nodes, F]
    edge_index: np.ndarray  # [2, total edges], local to each event
    edge_features: np.ndarray  # [total edges, G]
    node_offsets: np.ndarray  # [events + 1]
    edge_offsets: np.ndarray  # [events + 1]
    outputs: list[str] = field(default_factory=lambda: ["edge_score"])

    def __len__(self) -> int:
        return len(self.node_offsets) - 1

    def request(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        n0, n1 = self.node_offsets[lo], self.node_offsets[hi]
        e0, e1 = self.edge_offsets[lo], self.edge_offsets[hi]
        counts = np.diff(self.edge_offsets[lo : hi + 1])
        shift = np.repeat(self.node_offsets[lo:hi] - n0, counts)
        return {
            "node_features": self.node_features[n0:n1],
            "edge_index": self.edge_index[:, e0:e1] + shift,
            "edge_features": self.edge_features[e0:e1],
        }

    def check(self, lo: int, hi: int, outputs: dict[str, np.ndarray]) -> None:
        score = outputs.get("edge_score")
        edges = int(self.edge_offsets[hi] - self.edge_offsets[lo])
        if score is None or score.shape != (edges,):
            shape = None if score is None else score.shape
            raise AnswerError(f"{self.model}: edge_score shape {shape}, expected ({edges},)")
        if not np.all((score >= 0) & (score <= 1)):
            raise AnswerError(f"{self.model}: edge_score outside [0, 1]")


def _normalise(raw: np.ndarray, info: dict) -> np.ndarray:
    """weaver's preprocessing: (x - median) * norm_factor, clipped to the bounds."""
    x = (raw - info["median"]) * info["norm_factor"]
    return np.clip(x, info["lower_bound"], info["upper_bound"])


def _padded_mask(
    rng: np.random.Generator, n: int, mean: float, length: int, minimum: int = 0
) -> np.ndarray:
    counts = np.clip(rng.poisson(mean, n), minimum, length)
    return np.arange(length)[None, :] < counts[:, None]


def _constituents(
    rng: np.random.Generator,
    jet_pt: np.ndarray,
    mean: float,
    length: int,
    spread: float,
    radius: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """pT-ordered constituents sharing each jet's pT, spread in (Δη, Δφ) around its axis.
    Returns mask, pt, deta, dphi; padded slots have zero pT."""
    n = len(jet_pt)
    filled = _padded_mask(rng, n, mean, length, minimum=2)
    share = np.sort(rng.exponential(1.0, (n, length)) * filled, axis=1)[:, ::-1]
    mask = share > 0
    pt = share / share.sum(axis=1, keepdims=True) * jet_pt[:, None]
    deta = rng.normal(0, spread, (n, length)).clip(-radius, radius)
    dphi = rng.normal(0, spread, (n, length)).clip(-radius, radius)
    return mask, pt, deta, dphi


def particlenet_ak4(n: int, rng: np.random.Generator) -> Sample:
    """AK4 jets: pT-ordered PF candidates and secondary vertices, normalised with CMS's
    preprocessing, padded with zeros and masked."""
    pre = json.loads((CONFIG_DIR / "particlenet_ak4" / "preprocess.json").read_text())
    npf, nsv = pre["pf_features"]["length"], pre["sv_features"]["length"]
    jet_pt = 30 + rng.exponential(60, n)
    jet_eta = rng.uniform(-2.4, 2.4, n)
    pmask, pt, etarel, phirel = _constituents(rng, jet_pt, 22, npf, spread=0.08, radius=0.4)
    eta = jet_eta[:, None] + etarel
    charge = rng.choice([-1, 0, 1], (n, npf), p=[0.33, 0.34, 0.33])
    charged = charge != 0
    dz = rng.normal(0, 0.02, (n, npf)) * charged
    dxy = rng.normal(0, 0.01, (n, npf)) * charged
    sip = np.abs(rng.normal(0, 0.02, (n, npf))) * charged
    pf_raw = {
        "pfcand_pt_log_nopuppi": np.log(pt + 1e-9),
        "pfcand_e_log_nopuppi": np.log(pt * np.cosh(eta) + 1e-9),
        "pfcand_etarel": etarel,
        "pfcand_phirel": phirel,
        "pfcand_abseta": np.abs(eta),
        "pfcand_charge": charge,
        "pfcand_VTX_ass": rng.integers(0, 8, (n, npf)),
        "pfcand_lostInnerHits": rng.choice([-1, 0, 1, 2], (n, npf), p=[0.1, 0.8, 0.05, 0.05]),
        "pfcand_normchi2": rng.exponential(1.5, (n, npf)) * charged,
        "pfcand_quality": rng.integers(0, 8, (n, npf)) * charged,
        "pfcand_dz": dz,
        "pfcand_dzsig": dz / 0.01,
        "pfcand_dxy": dxy,
        "pfcand_dxysig": dxy / 0.005,
        "pfcand_btagEtaRel": rng.uniform(0, 5, (n, npf)) * charged,
        "pfcand_btagPtRatio": rng.uniform(0, 0.5, (n, npf)) * charged,
        "pfcand_btagPParRatio": rng.uniform(0.8, 1, (n, npf)) * charged,
        "pfcand_btagSip3dVal": sip,
        "pfcand_btagSip3dSig": sip / 0.01,
        "pfcand_btagJetDistVal": -np.abs(rng.normal(0, 0.01, (n, npf))) * charged,
    }
    smask = _padded_mask(rng, n, 0.9, nsv)
    sv_etarel = rng.normal(0, 0.1, (n, nsv))
    sv_phirel = rng.normal(0, 0.1, (n, nsv))
    d3d = rng.exponential(0.3, (n, nsv))
    sv_raw = {
        "sv_pt_log": np.log(rng.exponential(15, (n, nsv)) + 1),
        "sv_mass": rng.gamma(2, 0.6, (n, nsv)),
        "sv_etarel": sv_etarel,
        "sv_phirel": sv_phirel,
        "sv_abseta": np.abs(jet_eta[:, None] + sv_etarel),
        "sv_ntracks": rng.integers(2, 8, (n, nsv)),
        "sv_normchi2": rng.exponential(1, (n, nsv)),
        "sv_dxy": d3d * 0.8,
        "sv_dxysig": d3d * 0.8 / 0.02,
        "sv_d3d": d3d,
        "sv_d3dsig": d3d / 0.02,
    }

    def block(name: str, raw: dict[str, np.ndarray], mask: np.ndarray) -> np.ndarray:
        spec = pre[name]
        cols = [_normalise(raw[v], spec["var_infos"][v]) for v in spec["var_names"]]
        return (np.stack(cols, axis=1) * mask[:, None, :]).astype(np.float32)

    inputs = {
        "pf_points": block("pf_points", pf_raw, pmask),
        "pf_features": block("pf_features", pf_raw, pmask),
        "pf_mask": pmask[:, None, :].astype(np.float32),
        "sv_points": block("sv_points", sv_raw, smask),
        "sv_features": block("sv_features", sv_raw, smask),
        "sv_mask": smask[:, None, :].astype(np.float32),
    }
    return Sample("particlenet_ak4", inputs, ["softmax"], probabilities=True)


def particle_transformer(n: int, rng: np.random.Generator) -> Sample:
    """Large-radius jets in JetClass's input format (17 features, 4-vectors, 128 particles)."""
    length = 128
    jet_pt, jet_eta = rng.uniform(500, 1000, n), rng.uniform(-2, 2, n)
    mask, pt, deta, dphi = _constituents(rng, jet_pt, 50, length, spread=0.15, radius=0.8)
    eta, phi = jet_eta[:, None] + deta, dphi
    energy = pt * np.cosh(eta)
    pid = rng.integers(0, 5, (n, length))
    charge = np.where(pid == 0, rng.choice([-1, 1], (n, length)), 0)
    logs = lambda x: np.log(np.maximum(x, 1e-9))  # noqa: E731
    feats = [
        (logs(pt) - 1.7) * 0.7,
        (logs(energy) - 2.0) * 0.7,
        (logs(pt / jet_pt[:, None]) + 4.7) * 0.7,
        (logs(energy / energy.sum(1, keepdims=True)) + 4.7) * 0.7,
        (np.hypot(deta, dphi) - 0.2) * 4.0,
        charge,
        *[(pid == k).astype(float) for k in range(5)],
        np.tanh(rng.normal(0, 0.01, (n, length))),
        rng.uniform(0, 0.05, (n, length)),
        np.tanh(rng.normal(0, 0.01, (n, length))),
        rng.uniform(0, 0.05, (n, length)),
        deta,
        dphi,
    ]
    m = mask[:, None, :]
    vectors = np.stack([pt * np.cos(phi), pt * np.sin(phi), pt * np.sinh(eta), energy], axis=1)
    inputs = {
        "pf_points": (np.stack([deta, dphi], axis=1) * m).astype(np.float32),
        "pf_features": (np.stack(feats, axis=1) * m).astype(np.float32),
        "pf_vectors": (vectors * m).astype(np.float32),
        "pf_mask": m.astype(np.float32),
    }
    return Sample("particle_transformer", inputs, ["softmax"], probabilities=True)


def deepmet(n: int, rng: np.random.Generator) -> Sample:
    """Events of ~1500 PF candidates (up to 4500), momenta divided by CMSSW's norm of 50."""
    length = 4500
    mask = _padded_mask(rng, n, 1500, length, minimum=1)
    pt = rng.exponential(2.0, (n, length)) * mask
    eta = rng.uniform(-5, 5, (n, length))
    phi = rng.uniform(-np.pi, np.pi, (n, length))
    charge = rng.choice([-1, 0, 1], (n, length)) * mask
    charged = charge != 0
    cont = np.stack(
        [
            pt * np.cos(phi) / 50,
            pt * np.sin(phi) / 50,
            pt / 50,
            eta * mask,
            rng.normal(0, 0.01, (n, length)) * charged,
            rng.normal(0, 0.05, (n, length)) * charged,
            np.where(charged, 0.1396, 0.0) * mask,
            rng.uniform(0, 1, (n, length)) * mask,
        ],
        axis=-1,
    )
    inputs = {
        "input": cont.astype(np.float32),
        "input_cat0": ((charge + 1) * mask)[..., None].astype(np.float32),
        "input_cat1": (rng.integers(0, 8, (n, length)) * mask)[..., None].astype(np.float32),
        "input_cat2": (rng.integers(0, 4, (n, length)) * mask)[..., None].astype(np.float32),
    }
    return Sample("deepmet", inputs, ["output"])


def gnn_linking(n: int, rng: np.random.Generator) -> GraphSample:
    """Calorimeter fragments per event; each is linked to its nearest neighbours in (eta, phi)."""
    nodes, edges, nfeat, efeat, noff, eoff = [], [], [], [], [0], [0]
    for count in np.clip(rng.poisson(40, n), 2, None):
        eta, phi = rng.uniform(1.5, 3.0, count), rng.uniform(-np.pi, np.pi, count)
        energy, time = rng.exponential(10, count), rng.normal(0, 0.1, count)
        z = np.sign(eta) * rng.uniform(320, 360, count)
        x, y = z / np.sinh(eta) * np.cos(phi), z / np.sinh(eta) * np.sin(phi)
        feats = np.stack([energy, x, y, z, eta, phi, time, rng.integers(1, 40, count)], axis=1)
        d = np.hypot(eta[:, None] - eta[None, :], phi[:, None] - phi[None, :])
        np.fill_diagonal(d, np.inf)
        k = min(4, count - 1)
        nbr = np.argsort(d, axis=1)[:, :k]
        src, dst = np.repeat(np.arange(count), k), nbr.ravel()
        ef = np.stack(
            [
                d[src, dst],
                time[src] - time[dst],
                energy[src] / (energy[dst] + 1e-3),
                z[src] - z[dst],
            ],
            axis=1,
        )
        nodes.append(count)
        nfeat.append(feats)
        edges.append(np.stack([src, dst]))
        efeat.append(ef)
        noff.append(noff[-1] + count)
        eoff.append(eoff[-1] + len(src))
    return GraphSample(
        "gnn_linking",
        np.concatenate(nfeat).astype(np.float32),
        np.concatenate(edges, axis=1).astype(np.int64),
        np.concatenate(efeat).astype(np.float32),
        np.asarray(noff),
        np.asarray(eoff),
    )


def simple(n: int, rng: np.random.Generator) -> Sample:
    a = rng.integers(-1000, 1000, (n, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (n, 16), dtype=np.int32)
    return Sample(
        "simple",
        {"INPUT0": a, "INPUT1": b},
        ["OUTPUT0", "OUTPUT1"],
        expected={"OUTPUT0": a + b, "OUTPUT1": a - b},
    )


def identity(n: int, rng: np.random.Generator) -> Sample:
    x = rng.standard_normal((n, 1024), dtype=np.float32)
    return Sample("identity", {"INPUT0": x}, ["OUTPUT0"], expected={"OUTPUT0": x})


GENERATORS = {
    "simple": simple,
    "identity": identity,
    "particlenet_ak4": particlenet_ak4,
    "deepmet": deepmet,
    "particle_transformer": particle_transformer,
    "gnn_linking": gnn_linking,
}


def generate(model: str, n: int, seed: int) -> Sample | GraphSample:
    if model not in GENERATORS:
        raise ValueError(f"model: no sample generator for {model!r}; known: {sorted(GENERATORS)}")
    if n < 1:
        raise ValueError(f"events: expected at least 1, got {n}")
    return GENERATORS[model](n, np.random.default_rng(seed))
