"""``python -m ezat_compat.sim [flags]``: run the simulator (flags: ``server.build_parser``).

gevent is patched first, before anything imports ``socket`` or ``ssl``.
"""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402

from ezat_compat.sim.server import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
