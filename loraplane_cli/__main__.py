"""``python -m loraplane_cli``: the same as the ``loraplane`` console script."""

from loraplane_cli.main import main

main()
