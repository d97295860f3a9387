"""The ``loraplane`` command line: a client of the registry's REST API, and its launcher."""
