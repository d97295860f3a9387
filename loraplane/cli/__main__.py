"""``python -m loraplane.cli``: the same as the ``loraplane`` console script."""

from loraplane.cli.main import main

main()
