"""Imports the absolute encodings so that they register themselves."""
from . import learned, legendre, sinusoidal  # noqa: F401
