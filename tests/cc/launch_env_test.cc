#include <map>
#include <string>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/runtime/launch_env.h"

namespace interlace {
namespace {

Getenv env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(LaunchEnv, Torchrun) {
  auto o = resolve_bootstrap_options({}, env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "node7"},
                                              {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "run-1"},
                                              {"LOCAL_RANK", "3"}}));
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 8);
  EXPECT_EQ(o.master_addr, "node7");
  EXPECT_EQ(o.master_port, 29501);  // torch.distributed's store has MASTER_PORT itself
  EXPECT_EQ(o.secret, "run-1");
}

TEST(LaunchEnv, OpenMpiAndSlurm) {
  auto mpi = resolve_bootstrap_options({}, env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                                {"INTERLACE_MASTER_PORT", "4000"}}));
  EXPECT_EQ(mpi.rank, 1);
  EXPECT_EQ(mpi.world_size, 2);
  EXPECT_EQ(mpi.master_addr, "127.0.0.1");
  EXPECT_EQ(mpi.master_port, 4000);
  auto slurm = resolve_bootstrap_options({}, env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_JOB_ID", "77"},
                                                  {"MASTER_ADDR", "head"}, {"MASTER_PORT", "100"}}));
  EXPECT_EQ(slurm.rank, 5);
  EXPECT_EQ(slurm.world_size, 16);
  EXPECT_EQ(slurm.secret, "77");
  EXPECT_EQ(launcher_local_rank(env({{"SLURM_LOCALID", "2"}})), 2);
  EXPECT_EQ(launcher_local_rank(env({})), -1);
}

TEST(LaunchEnv, ExplicitValuesWin) {
  BootstrapOptions given;
  given.rank = 0;
  given.world_size = 2;
  given.master_port = 1234;
  given.secret = "mine";
  auto o = resolve_bootstrap_options(given, env({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "9"},
                                                 {"INTERLACE_SECRET", "env"}}));
  EXPECT_EQ(o.rank, 0);
  EXPECT_EQ(o.world_size, 2);
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.secret, "mine");
}

TEST(LaunchEnv, MissingOrBadValuesRaise) {
  EXPECT_THROW(resolve_bootstrap_options({}, env({})), Error);
  EXPECT_THROW(resolve_bootstrap_options({}, env({{"RANK", "x"}, {"WORLD_SIZE", "2"}})), Error);
  try {
    resolve_bootstrap_options({}, env({{"WORLD_SIZE", "2"}}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("torchrun"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace interlace
