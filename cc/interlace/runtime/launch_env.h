// Reads a job's rank, size and master address from the launcher's environment variables.
#pragma once

#include <functional>
#include <string>

#include "interlace/runtime/bootstrap.h"

namespace interlace {

using Getenv = std::function<const char*(const char*)>;

// Fills every field of `given` that is unset (rank/world_size/master_port < 0 or 0, empty strings)
// from, in this order: torchrun (RANK, WORLD_SIZE, MASTER_ADDR), Open MPI
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), SLURM (SLURM_PROCID, SLURM_NTASKS). The port is
// INTERLACE_MASTER_PORT, else MASTER_PORT + 1, because torch.distributed's store listens on
// MASTER_PORT itself. MASTER_ADDR defaults to 127.0.0.1 (one host). The secret
// comes from INTERLACE_SECRET, else the launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID,
// OMPI_MCA_ess_base_jobid), marked secret_is_job_id: it keeps jobs of one host apart, but the
// bootstrap does not accept it as a secret off loopback. Raises when rank or world size cannot be
// found anywhere.
BootstrapOptions resolve_bootstrap_options(BootstrapOptions given, const Getenv& getenv);

// The rank of this process among those on its host, if the launcher says (LOCAL_RANK,
// OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID); -1 otherwise.
int launcher_local_rank(const Getenv& getenv);

}  // namespace interlace
