"""Realistic synthetic events per model: jets with pT-ordered constituents normalised as
CMS's taggers expect (ParticleNet AK4, ParT), PF candidates for DeepMET, detector graphs for
the GNN, and the exact arithmetic of `simple` and `identity`."""

from __future__ import annotations

import json

import numpy as np
from sonicsite.client.layout import Column, Ragged
from sonicsite.client.spec import TensorSpec

from .repository import CONFIG_DIR
from .sample_types import Allocate, GraphSample, Sample


def _sample(
    model: str,
    inputs: dict[str, np.ndarray],
    outputs: list[Column],
    spec: TensorSpec,
    allocate: Allocate,
    **kwargs,
) -> Sample:
    """Lay out generated columns (and NaN-filled output columns) with `allocate`."""
    rows = next(iter(inputs.values())).shape[0]
    schema = [Column(n, a.dtype, a.shape[1:]) for n, a in inputs.items()] + outputs
    soa = allocate(schema, rows)
    for name, array in inputs.items():
        soa[name][...] = array
    for column in outputs:
        soa[column.name][...] = np.nan if column.dtype.kind == "f" else 0
    return Sample(model, soa, spec, **kwargs)


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


def particlenet_ak4(n: int, rng: np.random.Generator, allocate: Allocate) -> Sample:
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

    columns: dict[str, np.ndarray] = {}
    spec = TensorSpec("particlenet_ak4")
    for name, raw, mask in (
        ("pf_points", pf_raw, pmask),
        ("pf_features", pf_raw, pmask),
        ("sv_points", sv_raw, smask),
        ("sv_features", sv_raw, smask),
    ):
        block = pre[name]
        for var in block["var_names"]:
            columns[var] = (_normalise(raw[var], block["var_infos"][var]) * mask).astype(np.float32)
        spec.append_block(name, *block["var_names"])
    columns["pfcand_mask"] = pmask.astype(np.float32)
    columns["sv_mask"] = smask.astype(np.float32)
    spec.append_block("pf_mask", "pfcand_mask", shape=(-1, 1, npf))
    spec.append_block("sv_mask", "sv_mask", shape=(-1, 1, nsv))
    spec.append_output("softmax", "flavour")
    outputs = [Column("flavour", np.float32, (len(pre["output_names"]),))]
    return _sample("particlenet_ak4", columns, outputs, spec, allocate, probabilities=("flavour",))


def particle_transformer(n: int, rng: np.random.Generator, allocate: Allocate) -> Sample:
    """Large-radius jets in JetClass's input format (17 features, 4-vectors, 128 particles)."""
    length = 128
    jet_pt, jet_eta = rng.uniform(500, 1000, n), rng.uniform(-2, 2, n)
    mask, pt, deta, dphi = _constituents(rng, jet_pt, 50, length, spread=0.15, radius=0.8)
    eta, phi = jet_eta[:, None] + deta, dphi
    energy = pt * np.cosh(eta)
    pid = rng.integers(0, 5, (n, length))
    charge = np.where(pid == 0, rng.choice([-1, 1], (n, length)), 0)
    logs = lambda x: np.log(np.maximum(x, 1e-9))  # noqa: E731
    features = {
        "part_pt_log": (logs(pt) - 1.7) * 0.7,
        "part_e_log": (logs(energy) - 2.0) * 0.7,
        "part_logptrel": (logs(pt / jet_pt[:, None]) + 4.7) * 0.7,
        "part_logerel": (logs(energy / energy.sum(1, keepdims=True)) + 4.7) * 0.7,
        "part_deltaR": (np.hypot(deta, dphi) - 0.2) * 4.0,
        "part_charge": charge,
        **{
            f"part_is{kind}": (pid == k).astype(float)
            for k, kind in enumerate(
                ["ChargedHadron", "NeutralHadron", "Photon", "Electron", "Muon"]
            )
        },
        "part_d0val": np.tanh(rng.normal(0, 0.01, (n, length))),
        "part_d0err": rng.uniform(0, 0.05, (n, length)),
        "part_dzval": np.tanh(rng.normal(0, 0.01, (n, length))),
        "part_dzerr": rng.uniform(0, 0.05, (n, length)),
        "part_deta": deta,
        "part_dphi": dphi,
    }
    vectors = {
        "part_px": pt * np.cos(phi),
        "part_py": pt * np.sin(phi),
        "part_pz": pt * np.sinh(eta),
        "part_energy": energy,
    }
    columns = {k: (v * mask).astype(np.float32) for k, v in {**features, **vectors}.items()}
    columns["part_mask"] = mask.astype(np.float32)
    spec = (
        TensorSpec("particle_transformer")
        .append_block("pf_points", "part_deta", "part_dphi")
        .append_block("pf_features", *features)
        .append_block("pf_vectors", *vectors)
        .append_block("pf_mask", "part_mask", shape=(-1, 1, length))
        .append_output("softmax", "jet_class")
    )
    outputs = [Column("jet_class", np.float32, (10,))]
    return _sample(
        "particle_transformer", columns, outputs, spec, allocate, probabilities=("jet_class",)
    )


DEEPMET_FEATURES = ("px", "py", "pt", "eta", "d0", "dz", "mass", "puppi_weight")


def deepmet(n: int, rng: np.random.Generator, allocate: Allocate) -> Sample:
    """Events of ~1500 PF candidates (up to 4500), momenta divided by CMSSW's norm of 50."""
    length = 4500
    mask = _padded_mask(rng, n, 1500, length, minimum=1)
    pt = rng.exponential(2.0, (n, length)) * mask
    eta = rng.uniform(-5, 5, (n, length))
    phi = rng.uniform(-np.pi, np.pi, (n, length))
    charge = rng.choice([-1, 0, 1], (n, length)) * mask
    charged = charge != 0
    values = [
        pt * np.cos(phi) / 50,
        pt * np.sin(phi) / 50,
        pt / 50,
        eta * mask,
        rng.normal(0, 0.01, (n, length)) * charged,
        rng.normal(0, 0.05, (n, length)) * charged,
        np.where(charged, 0.1396, 0.0) * mask,
        rng.uniform(0, 1, (n, length)) * mask,
    ]
    columns = {k: v.astype(np.float32) for k, v in zip(DEEPMET_FEATURES, values, strict=True)}
    columns["charge_cat"] = ((charge + 1) * mask).astype(np.float32)
    columns["pdgid_cat"] = (rng.integers(0, 8, (n, length)) * mask).astype(np.float32)
    columns["frompv_cat"] = (rng.integers(0, 4, (n, length)) * mask).astype(np.float32)
    spec = (
        TensorSpec("deepmet")
        .append_block("input", *DEEPMET_FEATURES, axis=-1)
        .append_block("input_cat0", "charge_cat", shape=(-1, length, 1))
        .append_block("input_cat1", "pdgid_cat", shape=(-1, length, 1))
        .append_block("input_cat2", "frompv_cat", shape=(-1, length, 1))
        .append_output("output", "met_xy")
    )
    return _sample("deepmet", columns, [Column("met_xy", np.float32, (2,))], spec, allocate)


NODE_FEATURES = ("energy", "x", "y", "z", "eta", "phi", "time", "layers")
EDGE_FEATURES = ("delta_r", "delta_t", "energy_ratio", "delta_z")


def gnn_linking(n: int, rng: np.random.Generator, allocate: Allocate) -> GraphSample:
    """Calorimeter fragments per event; each is linked to its nearest neighbours in (eta, phi)."""
    nfeat, efeat, src_all, dst_all, noff, eoff = [], [], [], [], [0], [0]
    for count in np.clip(rng.poisson(40, n), 2, None):
        eta, phi = rng.uniform(1.5, 3.0, count), rng.uniform(-np.pi, np.pi, count)
        energy, time = rng.exponential(10, count), rng.normal(0, 0.1, count)
        z = np.sign(eta) * rng.uniform(320, 360, count)
        x, y = z / np.sinh(eta) * np.cos(phi), z / np.sinh(eta) * np.sin(phi)
        nfeat.append(np.stack([energy, x, y, z, eta, phi, time, rng.integers(1, 40, count)], 1))
        d = np.hypot(eta[:, None] - eta[None, :], phi[:, None] - phi[None, :])
        np.fill_diagonal(d, np.inf)
        k = min(4, count - 1)
        src, dst = np.repeat(np.arange(count), k), np.argsort(d, axis=1)[:, :k].ravel()
        efeat.append(
            np.stack(
                [
                    d[src, dst],
                    time[src] - time[dst],
                    energy[src] / (energy[dst] + 1e-3),
                    z[src] - z[dst],
                ],
                axis=1,
            )
        )
        src_all.append(src)
        dst_all.append(dst)
        noff.append(noff[-1] + count)
        eoff.append(eoff[-1] + len(src))
    node_values, edge_values = np.concatenate(nfeat), np.concatenate(efeat)
    nodes = allocate([Column(c, np.float32) for c in NODE_FEATURES], noff[-1])
    for k, name in enumerate(NODE_FEATURES):
        nodes[name][...] = node_values[:, k]
    edge_schema = [Column("src", np.int64), Column("dst", np.int64)]
    edges = allocate(edge_schema + [Column(c, np.float32) for c in EDGE_FEATURES], eoff[-1])
    edges["src"][...], edges["dst"][...] = np.concatenate(src_all), np.concatenate(dst_all)
    for k, name in enumerate(EDGE_FEATURES):
        edges[name][...] = edge_values[:, k]
    spec = (
        TensorSpec("gnn_linking")
        .append_block("node_features", *NODE_FEATURES, axis=-1)
        .append_block("edge_index", "src", "dst", axis=0)
        .append_block("edge_features", *EDGE_FEATURES, axis=-1)
        .append_output("edge_score")
    )
    scores = np.full(eoff[-1], np.nan, dtype=np.float32)
    return GraphSample("gnn_linking", Ragged(nodes, noff), Ragged(edges, eoff), spec, scores)


def simple(n: int, rng: np.random.Generator, allocate: Allocate) -> Sample:
    a = rng.integers(-1000, 1000, (n, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (n, 16), dtype=np.int32)
    spec = (
        TensorSpec("simple")
        .append_block("INPUT0", "a")
        .append_block("INPUT1", "b")
        .append_output("OUTPUT0", "sum")
        .append_output("OUTPUT1", "difference")
    )
    outputs = [Column("sum", np.int32, (16,)), Column("difference", np.int32, (16,))]
    return _sample(
        "simple",
        {"a": a, "b": b},
        outputs,
        spec,
        allocate,
        expected={"sum": a + b, "difference": a - b},
    )


def identity(n: int, rng: np.random.Generator, allocate: Allocate) -> Sample:
    x = rng.standard_normal((n, 1024), dtype=np.float32)
    spec = TensorSpec("identity").append_block("INPUT0", "x").append_output("OUTPUT0", "y")
    return _sample(
        "identity", {"x": x}, [Column("y", np.float32, (1024,))], spec, allocate, expected={"y": x}
    )
