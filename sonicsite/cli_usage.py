"""What the `sonicsite` command line refuses (exit status 2, naming the option): the values of
the site's own options (`--dir`, `--grpc`, `--tokens`, model lists, `--hold`, `models build
--out`), an option given without the one it belongs to or with one it cannot go with, a
stream's `--batch` over a model's max batch size; and what each command's exit status says
(the commands' help epilogs). Apart from the parser's option list (cli_parser.py), which
uses them, so that each stays short."""

from __future__ import annotations

import argparse
from pathlib import Path

from .cli_placement import site_option_orphans
from .contract.options import named_folder, named_twice, names, names_of, split_names
from .sim.output import file_in_the_way

# submit's options for the models run in the workers (not with --backend site)
LOCAL_BACKEND_OPTIONS = ("compile", "models_dir")
SHARED_MEMORY_TRANSPORTS = ("shm", "cuda")

UP_EXIT = (
    "exit status: 0 the site is up and every part answers; 3 it is up but something is down "
    "(as `sonicsite status` says it); 1 it could not be started (why is said; what it had "
    "started is stopped); 2 a usage error; 130 or 143 stopped by SIGINT or SIGTERM before it "
    "finished (what it had started is stopped)"
)
STREAM_EXIT = (
    "exit status: 0 every event was answered exactly once; 1 some were not (the report says "
    "which) or the stream was refused before any worker started (the site not up, --out "
    "unusable; why is said){demo}; 2 a usage error; 130 or 143 stopped by SIGINT or SIGTERM "
    "(every worker stopped, the report of what was done written)"
)
SUBMIT_EXIT = STREAM_EXIT.format(demo="")
DEMO_EXIT = STREAM_EXIT.format(demo=", or the site could not be started")
CHECK_EXIT = (
    "exit status: 0 every model answered and its answer checked; 1 a model failed (its line "
    "says why) or the --inputs file is not usable; 2 a usage error: a bad --grpc, or a model "
    "in --models with neither a demo sample nor a request in --inputs"
)


def host_port(text: str) -> str:
    """HOST:PORT (`check --grpc`): a host, and a port from 1 to 65535."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT with a port from 1 to 65535, e.g. 127.0.0.1:8001, got {text!r}"
        )
    if "/" in host:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT, with no scheme or path (gRPC takes none), e.g. "
            f"127.0.0.1:8001, got {text!r}"
        )
    if host.startswith("[") != host.endswith("]") or any(c.isspace() for c in host):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}: bad host {host!r}")
    return text


def model_list(text: str) -> list[str]:
    """Comma-separated names of the demo repository's models (`--models`, `--only`), none
    named twice."""
    from .models.repository import model_names

    return list(names_of(model_names(), "model")(text))


def any_models(text: str) -> list[str]:
    """Model names as a site may have them (`check`: not only the demo models)."""
    return list(names(text))


def held_models(text: str) -> tuple[str, list[str]]:
    """MODEL=SERVER[,SERVER...]: a model that only the named servers hold."""
    model, sep, servers = text.partition("=")
    chosen = list(split_names(servers))
    if not sep or not model.strip() or not chosen:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected MODEL=SERVER[,SERVER...], e.g. particlenet_ak4=triton-0"
        )
    if twice := named_twice(chosen):
        raise argparse.ArgumentTypeError(f"{text!r}: {', '.join(twice)} named twice")
    return model_list(model)[0], chosen


def tokens_file(text: str) -> Path:
    """`up --tokens FILE`: a readable file of bearer tokens, one per line, at least one, that
    only its owner may read (as the site's keys: tokens others can read protect nothing)."""
    path = Path(text).resolve()  # the gateway runs in the site's folder
    try:
        tokens = [t for t in path.read_text().splitlines() if t.strip()]
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise argparse.ArgumentTypeError(f"{text}: cannot read a file of tokens: {why}") from None
    if not tokens:
        raise argparse.ArgumentTypeError(
            f"{text}: no token in it (one per line); it would refuse every request"
        )
    if mode & 0o077:
        raise argparse.ArgumentTypeError(
            f"{text}: readable or writable by others (mode {mode & 0o777:o}); expected 600: "
            f"`chmod 600 {text}`"
        )
    return path


def site_folder(text: str) -> Path:
    """`--dir`: a site's folder; a path that exists as anything but a folder is refused (an
    argparse type), before a command tries to make it or read a state file in it."""
    would = "make the current folder the site's (its state.json, keys, logs and repository)"
    path = named_folder(text, would, ".sonicsite")
    if (in_the_way := file_in_the_way(path)) == path:
        raise argparse.ArgumentTypeError(
            f"{text}: is a file, not a folder (a site's folder holds its state.json, logs "
            "and repository); name a folder, or one that does not exist yet"
        )
    if in_the_way is not None:
        raise argparse.ArgumentTypeError(
            f"{text}: {in_the_way} is a file, not a folder, so no folder can be made there"
        )
    return path


def build_folder(text: str) -> Path:
    """`models build --out`: a folder for the built models; an empty name (the current
    folder) and a path below a file are refused before anything is built."""
    would = "write the models and manifest.json into the current folder"
    path = named_folder(text, would, "build/models")
    if (in_the_way := file_in_the_way(path)) is not None:
        which = "" if in_the_way == path else f" {in_the_way}"
        raise argparse.ArgumentTypeError(f"{text}:{which} is a file, not a folder")
    return path


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _held_twice(held: list[tuple[str, list[str]]]) -> str:
    """`up --hold` naming one model twice (the last would win, silently)."""
    for model in dict.fromkeys(m for m, _ in held):
        given = [",".join(servers) for m, servers in held if m == model]
        if len(given) > 1:
            every = ",".join(dict.fromkeys(",".join(given).split(",")))
            return (
                f"argument --hold: {model} is given {len(given)} times ({'; '.join(given)}); "
                f"name all its servers in one: --hold {model}={every}"
            )
    return ""


def option_conflicts(args: argparse.Namespace) -> str:
    """An option given without the one it belongs to (it would be ignored), or with one it
    cannot go with, in words; '' when there is none."""
    if args.command == "up" and (why := site_option_orphans(args) or _held_twice(args.hold)):
        return why
    build = args.command == "models" and args.models_command == "build"
    if build and args.framework is not None and not args.configs:
        return (
            "argument --framework: needs --configs (it picks the config.pbtxt written beside "
            "the built files; without --configs none is written, and the build is the same)"
        )
    shared = args.command in ("submit", "demo") and args.transport in SHARED_MEMORY_TRANSPORTS
    if shared and args.mode == "site":
        return (
            f"argument --transport {args.transport}: needs --mode direct (shared memory is "
            "written by the worker and read by a server on the same machine, not through "
            "Envoy); leave --mode out to get it"
        )
    if args.command in ("submit", "demo") and args.batch:
        from .jobs.preflight import over_max_batch  # submit's own check, before its site's

        if why := over_max_batch(args.model, args.batch):
            return f"argument --batch: {why}"
    if args.command == "submit" and args.backend == "site":
        for dest in LOCAL_BACKEND_OPTIONS:
            if getattr(args, dest) is not None:
                return (
                    f"argument {_option(dest)}: needs --backend local or auto (with --backend "
                    "site the models run on the site, not in the workers)"
                )
    return ""
