"""Reading CRDs and manifests as the API server reads them, and finding an object's schema."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import yaml

GVK = tuple[str, str, str]
"""(group, version, kind); the group of a core kind is ''."""


# libyaml's parser where PyYAML has it (the wheels do): the same documents, ten times faster
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(SAFE_LOADER):
    """YAML read the way the API server reads it: timestamps stay strings (sigs.k8s.io/yaml)."""

    yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, re.Pattern[str]]]]] = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


def load_yaml_documents(text: str) -> list[Any]:
    """Every non-empty document of a (multi-document) YAML text, as the API server parses it."""
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]


def load_crds(folder: Path) -> dict[GVK, dict]:
    """Map (group, version, kind) to the openAPIV3Schema of every served CRD version in a folder.

    Any *.yaml, *.yml or *.json file may hold several documents; those that are not a
    CustomResourceDefinition are ignored, so a folder of mixed manifests works too.
    """
    crds: dict[GVK, dict] = {}
    paths = sorted(p for ext in ("*.yaml", "*.yml", "*.json") for p in folder.glob(ext))
    for path in paths:
        for doc in load_yaml_documents(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc.get("spec") or {}
            group, kind = spec.get("group", ""), (spec.get("names") or {}).get("kind", "")
            # apiextensions.k8s.io/v1beta1 CRDs may carry one schema for all versions.
            shared = (spec.get("validation") or {}).get("openAPIV3Schema")
            versions = spec.get("versions") or [{"name": spec.get("version"), "served": True}]
            for version in versions:
                if not version.get("served", True):
                    continue
                schema = (version.get("schema") or {}).get("openAPIV3Schema") or shared
                crds[(group, version["name"], kind)] = schema or {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                }
    return crds


def gvk_of(obj: Mapping[str, Any]) -> GVK:
    """The (group, version, kind) an object claims through apiVersion and kind."""
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    group, _, version = api_version.rpartition("/")
    return group, version, kind


def find_schema(obj: Mapping[str, Any], crds: Mapping[GVK, dict]) -> dict | None:
    """The schema for an object's kind, or None when no loaded CRD defines it."""
    return crds.get(gvk_of(obj))
