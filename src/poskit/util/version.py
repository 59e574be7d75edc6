"""poskit's version: recorded in run directories, checkpoints and results, and shown by `poskit --version`."""
__version__ = "0.1.0"
