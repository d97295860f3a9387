"""The routing API's bodies: the wire contract lives in the shared core."""

from __future__ import annotations

from loraplane.api.routing import RouteList, RouteOut, RoutePut

__all__ = ["RouteList", "RouteOut", "RoutePut"]
