"""The page for people at ``/ui``: adapters, their version timelines and the fleet, live.

The page is static HTML, CSS and JS from ``static/`` (nothing from the internet); it reads
the JSON endpoints under ``/ui/api`` with the registry token it was given.
"""
