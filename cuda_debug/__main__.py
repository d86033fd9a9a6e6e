"""``python -m cuda_debug`` and the ``cuda-debug`` console script: see cuda_debug._cli."""
import sys


def main(argv=None) -> int:
    from ._cli import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
