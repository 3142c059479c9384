"""Parallel layouts (dp x tp x pp) and their process groups."""

from hpctrain.parallel.topology import Coord, Layout

__all__ = ["Coord", "Layout"]
