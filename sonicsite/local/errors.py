"""What can go wrong with a local site: one base class, so that a command catches them all,
and one subclass per part, so that the message's reader knows where to look."""


class SiteError(RuntimeError):
    """The site could not be started or stopped; the message says what to do."""


class TritonError(SiteError):
    """Triton could not be found, started or made ready; the message says why."""


class EnvoyError(SiteError):
    """Envoy is missing, refused its config, or did not become ready."""


class PrometheusError(SiteError):
    """Prometheus is missing, refused its config, or a query failed."""
