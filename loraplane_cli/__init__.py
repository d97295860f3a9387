"""The ``loraplane`` command line: a client of the registry's REST API, and the launcher of
both services (``registry serve``, ``agent``)."""
