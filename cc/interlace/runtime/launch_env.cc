#include "interlace/runtime/launch_env.h"

#include <cstdlib>

#include "interlace/base/error.h"

namespace interlace {
namespace {

// The first of `names` that is set, parsed as an integer; -1 if none is set.
int first_int(const Getenv& getenv, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* value = getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    long parsed = std::strtol(value, &end, 10);
    IL_CHECK(end && *end == '\0' && parsed >= 0, "environment variable ", name, "='", value,
             "' is not a non-negative integer");
    return static_cast<int>(parsed);
  }
  return -1;
}

std::string first_string(const Getenv& getenv, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* value = getenv(name);
    if (value != nullptr && *value != '\0') return value;
  }
  return std::string();
}

}  // namespace

BootstrapOptions resolve_bootstrap_options(BootstrapOptions given, const Getenv& getenv) {
  if (given.rank < 0) given.rank = first_int(getenv, {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"});
  if (given.world_size < 0) given.world_size = first_int(getenv, {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"});
  if (given.master_addr.empty()) given.master_addr = first_string(getenv, {"MASTER_ADDR"});
  if (given.master_port <= 0) given.master_port = first_int(getenv, {"INTERLACE_MASTER_PORT"});
  if (given.master_port <= 0) {
    // torch.distributed's store already listens on MASTER_PORT; take the port after it.
    int torch_port = first_int(getenv, {"MASTER_PORT"});
    if (torch_port > 0) given.master_port = torch_port + 1;
  }
  if (given.secret.empty()) given.secret = first_string(getenv, {"INTERLACE_SECRET"});
  if (given.secret.empty()) {
    given.secret = first_string(getenv, {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid"});
    given.secret_is_job_id = !given.secret.empty();
  }
  IL_CHECK(given.rank >= 0 && given.world_size > 0,
           "cannot tell this process's rank and world size: pass rank= and world_size=, or start it with "
           "torchrun (RANK, WORLD_SIZE), mpirun (OMPI_COMM_WORLD_*) or srun (SLURM_PROCID, SLURM_NTASKS)");
  if (given.world_size > 1 && given.master_addr.empty()) given.master_addr = "127.0.0.1";
  return given;
}

int launcher_local_rank(const Getenv& getenv) {
  return first_int(getenv, {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"});
}

}  // namespace interlace
