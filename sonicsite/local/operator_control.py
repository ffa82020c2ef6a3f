"""Changing what a local site's operator decides, as the site's own user: its PUTs need the
site's control token (`CONTROL_HEADER`), which only the holders of the admission key have
(the operator, the gateway, and whoever may read the site's 0600 `admission.key`).

`python -m sonicsite.local.operator_control SITE_DIR` prints the token, for curl:
`curl -X PUT -H "sonicsite-control: $(python -m sonicsite.local.operator_control DIR)" ...`.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from sonicsite.contract.admission_pass import AdmissionPasses
from sonicsite.contract.wire import ADMISSION_KEY_FILE, CONTROL_HEADER

from .admin_key import read_key
from .errors import SiteError


def control_token(site_dir: Path) -> str:
    """The site's control token; SiteError naming the key file when it cannot be read, is
    empty or others may read it."""
    return AdmissionPasses(read_key(Path(site_dir), ADMISSION_KEY_FILE).encode()).control_token()


def put(site_dir: Path, operator: str, path: str, body: object, timeout: float = 5.0) -> dict:
    """PUT `body` (as JSON) to `path` on the operator at `operator` (host:port) with the
    site's control token: its JSON answer. HTTPError (with the operator's reason in its
    body) when refused."""
    request = urllib.request.Request(
        f"http://{operator}{path}",
        data=json.dumps(body).encode(),
        method="PUT",
        headers={"Content-Type": "application/json", CONTROL_HEADER: control_token(site_dir)},
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read() or b"{}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m sonicsite.local.operator_control SITE_DIR", file=sys.stderr)
        return 2
    try:
        print(control_token(Path(argv[0])))
    except SiteError as exc:
        print(f"sonicsite: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
