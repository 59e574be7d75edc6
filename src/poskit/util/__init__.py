"""The bottom layer: small utilities that import nothing of poskit (argument validators, config fields checked
against their annotations, durable file writes, the one exclusive inter-process file lock)."""
