"""The launchers hcclpy knows, by the variables they give each process: one table, read by
:func:`hcclpy.init` (``hcclpy.bootstrap``), the flight recorder's dumps and the library loader."""

from __future__ import annotations

from typing import Mapping, NamedTuple, Optional


class Launcher(NamedTuple):
    """The variables one launcher sets in every process it starts."""

    name: str
    rank: str
    size: str
    local_rank: str
    local_size: str
    job_id: str  # what tells this job's processes from another job's on the same hosts


# In order of precedence: torchrun's variables (which hcclpy run sets too) win over a Slurm
# allocation's or an MPI launcher's that started the launcher.
LAUNCHERS = (
    Launcher("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"),
    Launcher("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID"),
    Launcher("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_NAMESPACE"),
    Launcher("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_KVSNAME"),
)


def launch_rank(env: Mapping[str, str]) -> Optional[int]:
    """This process's rank in its launcher's job (the first launcher that gives both a rank and a
    size), or None without a launcher or when the variables are not numbers."""
    for launcher in LAUNCHERS:
        rank, size = env.get(launcher.rank, "").strip(), env.get(launcher.size, "").strip()
        if rank and size:
            return int(rank) if rank.isdigit() else None
    return None
