"""A stand-in for a compiled module that records what a wrapper launches (no GPU needed)."""

from __future__ import annotations


class RecordingModule:
    name = "recording"

    def __init__(self):
        self.launches = []  # (entry, params struct type name, params)

    def check_params(self, entry, struct_type):
        pass

    def launch(self, entry, params, stream):
        self.launches.append((entry, type(params).__name__, params))
