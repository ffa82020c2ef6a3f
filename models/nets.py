"""PyTorch definitions of the two models weaver-core does not provide.

Weights are random but seeded: the site serves and measures real graphs of the real sizes,
and every build gives the same ONNX file.
"""

from __future__ import annotations

import torch
from torch import nn

# DeepMET's continuous features, in input order; px and py are what the weights multiply.
DEEPMET_FEATURES = ("px", "py", "pt", "eta", "d0", "dz", "mass", "puppi_weight")
DEEPMET_CATEGORIES = (3, 8, 4)  # charge+1, PF candidate type, fromPV flag
DEEPMET_NORM = 50.0  # CMSSW DeepMETProducer norm_factor: momenta are divided by it


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DeepMET(nn.Module):
    """Per-candidate weights from embedded categories and continuous features;
    MET = -Σ w·(px, py), in GeV."""

    def __init__(self, embed_dim: int = 8, hidden: int = 64) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(n, embed_dim) for n in DEEPMET_CATEGORIES)
        width = len(DEEPMET_FEATURES) + embed_dim * len(DEEPMET_CATEGORIES)
        self.weight_net = _mlp([width, hidden, hidden, 1])

    def forward(self, x, cat0, cat1, cat2):
        cats = [cat0, cat1, cat2]
        embedded = [emb(c.squeeze(-1).long()) for emb, c in zip(self.embeddings, cats, strict=True)]
        h = torch.cat([x, *embedded], dim=-1)
        w = torch.sigmoid(self.weight_net(h))  # [N, P, 1]
        return -(w * x[..., 0:2]).sum(dim=1) * DEEPMET_NORM


class EdgeScorer(nn.Module):
    """One round of message passing over fragments, then a score in [0, 1] for every edge."""

    def __init__(self, node_dim: int = 8, edge_dim: int = 4, hidden: int = 32) -> None:
        super().__init__()
        self.hidden = hidden
        self.node_net = _mlp([node_dim, hidden, hidden])
        self.message_net = _mlp([2 * hidden + edge_dim, hidden, hidden])
        self.update_net = _mlp([2 * hidden, hidden, hidden])
        self.edge_net = _mlp([2 * hidden + edge_dim, hidden, 1])

    def forward(self, node_features, edge_index, edge_features):
        src, dst = edge_index[0], edge_index[1]
        h = self.node_net(node_features)
        messages = self.message_net(torch.cat([h[src], h[dst], edge_features], dim=-1))
        index = dst.unsqueeze(-1).expand(-1, self.hidden)
        aggregated = torch.zeros_like(h).scatter_add(0, index, messages)
        h = self.update_net(torch.cat([h, aggregated], dim=-1))
        logits = self.edge_net(torch.cat([h[src], h[dst], edge_features], dim=-1))
        return torch.sigmoid(logits).squeeze(-1)
