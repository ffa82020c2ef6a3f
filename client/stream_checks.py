"""What a stream checks before its chunks go out, in the caller's own frame: the spec against
the model's metadata for the first chunk's columns (a bad spec is the caller's SpecError or
CopyRefused, raised from `run`, not from one of the stream's threads), and that the site
has a model of that name at all (`ModelNotServed`, naming the models it serves).

The check asks one endpoint believed up for the metadata (`_asked`; engine.py keeps what it
answers per endpoint); when it does not answer (down, out of time, a model not loaded
there) the check says nothing and the chunks follow the retry rule. The first chunk's
columns are asked of the source here, once: that chunk is given them, not asked again.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .balancer import Endpoint
from .errors import InferError, not_found
from .layout import Columns
from .plan import make_plan
from .stream_io import Source
from .transport_grpc import CONTROL_TIMEOUT_S

if TYPE_CHECKING:
    from .engine import Stream


class ModelNotServed(ValueError):
    """The site has no model of the stream's name (every endpoint asked says not found);
    the message names the model, who said so and the models the site serves."""


def not_served(
    model: str, served: Sequence[str], endpoint: Endpoint, exc: InferError
) -> ModelNotServed | None:
    """`exc`, an answer of `endpoint`, as the site saying it has no model `model`: a
    balanced endpoint (Envoy, the gateway: the site's word) or a server, when the servers'
    lists (`served`, from discovery) do not name the model either. A model they list, or
    one a placing site is still loading (held, never "not found"), is no refusal."""
    if not not_found(exc) or model in served:
        return None
    if endpoint.path == "direct" and not served:  # one server of a site whose models are unknown
        return None
    serves = f"the site serves {sorted(served)}" if served else "the site lists no models"
    return ModelNotServed(
        f"model {model!r}: not served by the site ({exc}); {serves}: check the model's "
        "name (a stream's model and its TensorSpec's)"
    )


class FirstRequest:
    """A source whose first chunk's columns were asked for already (by the checks): that
    chunk is given them once; every other request goes to the source."""

    def __init__(self, source: Source, first: tuple[int, int], columns: Columns):
        self.source, self.first, self._columns = source, first, columns
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.source)

    def request(self, lo: int, hi: int) -> Columns:
        with self._lock:
            if (lo, hi) == self.first and self._columns is not None:
                columns, self._columns = self._columns, None
                return columns
        return self.source.request(lo, hi)


def check_first(stream: Stream, source: Source, first: tuple[int, int]) -> FirstRequest:
    """The stream's spec checked against the model's metadata and the `first` chunk's
    columns, and the model's name against the site, before any chunk is sent (module
    docstring); returns the source that gives the first chunk those columns."""
    columns = source.request(*first)
    asked = _asked(stream)
    if asked is not None:
        # a control call: as long as a try may take, at least 2 s (the floor of a learnt
        # deadline: timeouts.py), at most a control call's own cap
        timeout = min(CONTROL_TIMEOUT_S, max(stream.options.timeout_s, 2.0))
        try:
            info = stream.model_info(asked, timeout)
        except InferError as exc:
            refusal = not_served(stream.model, stream.served, asked, exc)
            if refusal is not None:
                raise refusal from None
        except (OSError, ValueError, KeyError, TypeError):  # the chunks' tries will say
            pass
        else:
            make_plan(stream.spec, info, columns, strict=stream.options.strict)
    return FirstRequest(source, first, columns)


def _asked(stream: Stream) -> Endpoint | None:
    """The endpoint the checks ask, of those believed up: for a model the servers list, a
    server (it answers for itself: a site loading the model holds a request to Envoy or the
    gateway until it is loaded, and the check is no request of the job's); for one they do
    not list, the first (Envoy, in site mode: the site's word that it has no such model)."""
    up = [e for e in stream.balancer.endpoints if not e.failures and not e.probing]
    servers = [e for e in up if e.path == "direct"]
    if stream.model in stream.served and servers:
        return servers[0]
    return up[0] if up else None
