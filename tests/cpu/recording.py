"""A stand-in for a compiled module that records what a wrapper plans and launches (no GPU needed)."""

from __future__ import annotations

from replayssm.jit import constants as C
from replayssm.ops.abi import KernelLaunch, ScheduleStruct


class RecordingModule:
    """plan() answers a fixed-form schedule (persistent when forced on, else the tile kernel; rows
    as forced or 32); the real decisions are tested on real modules (test_persistent_choice.py)."""

    name = "recording"

    def __init__(self, unit_terms_bytes: int = 0):
        self.unit_terms_bytes = unit_terms_bytes  # a persistent plan's workspace bytes per unit (KDA's verify)
        self.launches = []  # (entry, params struct type name, params)
        self.queries = []
        self.schedules = []  # the ScheduleStruct handed to each step launch

    def check_params(self, entry, struct_type):
        pass

    def plan(self, query, entry=None):
        self.queries.append(query)
        rows = query.rows_per_cta or 32
        tile = KernelLaunch(kernel=C.constants()["kKernelTile"], rows_per_cta=rows, grid=1, threads=128)
        main = tile
        if query.persistent == C.PERSISTENT_ON:
            main = KernelLaunch(
                kernel=C.constants()["kKernelPersistent"],
                rows_per_cta=rows,
                heads_per_unit=1,
                grid=1,
                threads=160,
                units=query.batch * query.heads,
            )
            return ScheduleStruct(main=main, tile=tile, unit_terms_bytes=self.unit_terms_bytes if query.drafts else 0)
        return ScheduleStruct(main=main, tile=tile)

    def launch_step(self, params, schedule, stream):
        self.launches.append((C.ENTRY_STEP, type(params).__name__, params))
        self.schedules.append(schedule)

    def launch_commit(self, params, stream):
        self.launches.append((C.ENTRY_COMMIT, type(params).__name__, params))
