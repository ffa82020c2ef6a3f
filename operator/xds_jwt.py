"""Envoy's bearer-JWT check (jwt_authn) and, for a JWKS URI, the cluster of the identity
provider's host it fetches the keys through; the listener (xds_resources.py) runs the filter,
the snapshot serves the cluster."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from .xds_resources import GOOGLE, TYPE_URLS

JWKS_CLUSTER = "sonicsite_jwks"  # the identity provider's JWKS host (JwtPolicy.jwks_uri)
SYSTEM_CA_FILE = "/etc/ssl/certs/ca-certificates.crt"  # Envoy's image and Debian's


@dataclass(frozen=True)
class JwtPolicy:
    """Envoy requires a valid bearer JWT on every request (jwt_authn): from `issuer`, for
    one of `audiences` (any when empty), signed by a key of the issuer's JWKS: a file Envoy
    reads (`jwks_file`), or the provider's URI (`jwks_uri`), which Envoy fetches through a
    cluster of its own (`clusters`), keeps `jwks_cache_s` and fetches again, so that
    rotated keys are taken up without a restart. An https URI's certificate is checked
    against `jwks_ca_file` (the system's CAs by default) and the URI's host."""

    issuer: str
    jwks_file: str = ""
    audiences: tuple[str, ...] = ()
    jwks_uri: str = ""
    jwks_cache_s: int = 300
    jwks_ca_file: str = SYSTEM_CA_FILE

    def __post_init__(self) -> None:
        if bool(self.jwks_file) == bool(self.jwks_uri):
            raise ValueError("jwt: expected exactly one of a JWKS file or a JWKS URI")
        if self.jwks_uri:
            parts = urlsplit(self.jwks_uri)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(
                    f"jwt: expected an http(s)://host/... JWKS URI, got {self.jwks_uri!r}"
                )
        if self.jwks_cache_s < 1:
            raise ValueError(f"jwt: expected jwks_cache_s >= 1, got {self.jwks_cache_s}")

    def http_filter(self) -> dict:
        # the token goes on: REST through Envoy is the gateway's, which checks it again when
        # its own auth is on (Triton ignores the header)
        provider = {"issuer": self.issuer, "forward": True}
        if self.jwks_uri:
            provider["remote_jwks"] = {
                "http_uri": {"uri": self.jwks_uri, "cluster": JWKS_CLUSTER, "timeout": "5s"},
                "cache_duration": f"{self.jwks_cache_s}s",
                # fetched before the listener serves, and again 1 s after a failed fetch
                "async_fetch": {"failed_refetch_duration": "1s"},
                "retry_policy": {
                    "num_retries": 3,
                    "retry_back_off": {"base_interval": "0.2s", "max_interval": "2s"},
                },
            }
        else:
            provider["local_jwks"] = {"filename": self.jwks_file}
        if self.audiences:
            provider["audiences"] = list(self.audiences)
        return {
            "name": "envoy.filters.http.jwt_authn",
            "typed_config": {
                "@type": f"{GOOGLE}.filters.http.jwt_authn.v3.JwtAuthentication",
                "providers": {"sonicsite": provider},
                "rules": [{"match": {"prefix": "/"}, "requires": {"provider_name": "sonicsite"}}],
            },
        }

    def clusters(self) -> list[dict]:
        """The JWKS host's cluster, by DNS name (none for a file)."""
        if not self.jwks_uri:
            return []
        parts = urlsplit(self.jwks_uri)
        secure = parts.scheme == "https"
        host, port = parts.hostname, parts.port or (443 if secure else 80)
        cluster = {
            "@type": TYPE_URLS["clusters"],
            "name": JWKS_CLUSTER,
            "type": "STRICT_DNS",
            "dns_lookup_family": "V4_PREFERRED",
            "connect_timeout": "2s",
            "load_assignment": {
                "cluster_name": JWKS_CLUSTER,
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": {
                                        "socket_address": {"address": host, "port_value": port}
                                    }
                                }
                            }
                        ]
                    }
                ],
            },
        }
        if secure:
            san = "IP_ADDRESS" if _is_ip(host) else "DNS"
            cluster["transport_socket"] = {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": f"{GOOGLE}.transport_sockets.tls.v3.UpstreamTlsContext",
                    "sni": host,
                    "common_tls_context": {
                        "validation_context": {
                            "trusted_ca": {"filename": self.jwks_ca_file},
                            "match_typed_subject_alt_names": [
                                {"san_type": san, "matcher": {"exact": host}}
                            ],
                        }
                    },
                },
            }
        return [cluster]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
