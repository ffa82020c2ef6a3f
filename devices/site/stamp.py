"""A bench JSON written on a lent machine names the commit that ran (the machine has no git
checkout: $SITE_COMMIT, which the call sets from `git rev-parse HEAD` here, else the commit
the bundle was built from) and the machine (run_b.sh). Arguments: the JSON, the bundle's
provenance.json."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path


def main(result: Path, provenance: Path) -> int:
    if not result.is_file():
        print(f"{result}: the bench wrote no result")
        return 1
    data = json.loads(result.read_text())
    bundle = json.loads(provenance.read_text())
    meta = data.setdefault("meta", {})
    given = os.environ.get("SITE_COMMIT", "")
    meta["commit"] = given or bundle["commit"]
    meta["commit_from"] = "the call ($SITE_COMMIT)" if given else "the bundle's provenance"
    meta["uncommitted_changes"] = None if given else bundle["uncommitted_changes"]
    meta["machine"] = (
        f"a lent GPU machine (devices/site): {os.cpu_count()} cores, {platform.platform()}; "
        "the site's processes on its CPUs, as on the local site"
    )
    result.write_text(json.dumps(data, indent=1))
    print(json.dumps(data.get("summary"), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
