"""``python -m cuda_debug`` and the ``cuda-debug`` console script: see cuda_debug/_cli/.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md)."""
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """The entry point of both: help and usage name the command as invoked
    (sys.argv[0]; ``python -m cuda_debug`` when `argv` is given)."""
    from ._cli import MODULE_PROG, main as cli_main, prog_name
    return cli_main(argv, prog=prog_name(sys.argv[0]) if argv is None else MODULE_PROG)


if __name__ == "__main__":
    sys.exit(main())
