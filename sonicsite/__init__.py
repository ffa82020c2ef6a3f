"""sonicsite: inference-as-a-service for high-energy-physics computing sites."""

import os as _os

__version__ = "0.1.0"

# Imported from a checkout's root (`python -c "import sonicsite.client"` run there, a worker
# script started there without `python -P`), `sonicsite` is this folder, not the installed
# package, and the other rooms are the folders beside it that pyproject.toml's package-dir
# maps to sonicsite.client, sonicsite.operator, ... (each to the folder of its own name):
# the root joins the package's path, so they are found where the installed package finds
# them. Installed (a wheel, or the editable install's tree), the rooms are folders of the
# package itself and nothing is added.
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "client")) and _os.path.isfile(
    _os.path.join(_root, "client", "__init__.py")
):
    __path__.append(_root)
