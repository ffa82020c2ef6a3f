"""`python -P -m sonicsite.local.operator_main`: the operator of a local site.

The operator's own options and loop (sonicsite.operator.main), with what only the local
site can give it: the actuator that starts servers and drains them (servers.LocalActuator).
So the dependency points one way: the local site uses the operator, never the reverse.
"""

from __future__ import annotations

import sys

from sonicsite.operator import main as operator_main

from .servers import LocalActuator


def main(argv: list[str] | None = None) -> int:
    options = operator_main.parser()
    args = options.parse_args(argv)
    actuate = LocalActuator(args.site, args.placement) if args.site else None
    operator = operator_main.build(args, options, actuate)
    return operator_main.serve(operator, args.host, args.port, args.xds_port)


if __name__ == "__main__":
    sys.exit(main())
