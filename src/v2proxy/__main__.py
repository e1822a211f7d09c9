"""``python -m v2proxy`` and the ``v2proxy`` console script."""

import sys

from v2proxy.cli import main as _cli_main


def main() -> None:
    sys.exit(_cli_main())


if __name__ == "__main__":
    main()
