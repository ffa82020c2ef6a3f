"""Triton's routes the gateway refuses, each with a 403 in KServe's error shape that says why
and where to go instead. Through a balancer each call would land on one arbitrary server of
the pool, so none of them can do what a client means by it:

- shared memory (system and CUDA): a region is registered with one server and must live on
  its machine; it is a direct, co-located path to a server's own port;
- model loading and unloading, trace and logging settings: they change a shared server;
  they belong to the site's control plane (the servers refuse them without its key).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Response

from .forwarding import error

router = APIRouter(tags=["refused"])

SHARED_MEMORY = (
    "shared memory is refused through the gateway: a region is registered with one server "
    "and lives on its machine, so use a co-located server's own port (its address is in "
    "/v1/site)"
)
REPOSITORY = (
    "loading and unloading models is refused through the gateway: the site's control plane "
    "decides which server holds which model"
)
TRACE = (
    "trace settings are refused through the gateway: they would change one arbitrary server "
    "of the pool; the site's control plane sets them"
)
LOGGING = (
    "logging settings are refused through the gateway: they would change one arbitrary "
    "server of the pool; the site's control plane sets them"
)


REFUSED = (  # (path, methods, why, name)
    ("/v2/systemsharedmemory/{rest:path}", ("GET", "POST"), SHARED_MEMORY, "system_shared_memory"),
    ("/v2/cudasharedmemory/{rest:path}", ("GET", "POST"), SHARED_MEMORY, "cuda_shared_memory"),
    ("/v2/repository/models/{model}/load", ("POST",), REPOSITORY, "load_model"),
    ("/v2/repository/models/{model}/unload", ("POST",), REPOSITORY, "unload_model"),
    ("/v2/trace/setting", ("GET", "POST"), TRACE, "trace_setting"),
    ("/v2/models/{model}/trace/setting", ("GET", "POST"), TRACE, "model_trace_setting"),
    ("/v2/logging", ("GET", "POST"), LOGGING, "logging_setting"),
)


def _refusal(why: str) -> Callable[[], Awaitable[Response]]:
    async def refused() -> Response:
        return error(403, why)

    return refused


for _path, _methods, _why, _name in REFUSED:
    for _method in _methods:  # one operation per method: OpenAPI ids stay unique
        router.add_api_route(
            _path,
            _refusal(_why),
            methods=[_method],
            name=f"{_name}_{_method.lower()}",
            summary=f"refused: {_name.replace('_', ' ')}",
            description=_why,
        )
