"""`python -m omni_backend.supervisor --model-repository DIR [tritonserver flags] [--supervisor-* flags]`
(also the venv's `tritonserver` command): run tritonserver under supervision."""
from __future__ import annotations

import asyncio
import logging
import sys

from omni_backend.supervisor.options import UsageError, parse
from omni_backend.supervisor.supervisor import Supervisor


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s [supervisor] %(levelname)s %(message)s")
    try:
        opts = parse(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return asyncio.run(Supervisor(opts).run())


if __name__ == "__main__":
    sys.exit(main())
