// libibverbs loaded at run time: on our machines (rdma-core installed, no RDMA adapter) it loads,
// lists no devices, and asking for one says so; a named device that is absent is named back.
#include "interlace/transport/verbs_library.h"

#include <string>

#include "gtest/gtest.h"
#include "interlace/base/error.h"

namespace interlace {
namespace {

std::string error_of(const std::vector<RdmaDevice>& devices, const std::string& name) {
  try {
    choose_rdma_device(devices, name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(VerbsLibrary, LoadsAndListsDevicesWithoutRaising) {
  VerbsLibrary& library = VerbsLibrary::load();  // tools/setup installs rdma-core's libibverbs
  const std::vector<RdmaDevice> devices = library.devices();
  if (devices.empty()) {
    EXPECT_NE(error_of(devices, "").find("no RDMA devices"), std::string::npos);
  } else {
    EXPECT_EQ(choose_rdma_device(devices).name, devices.front().name);
  }
}

TEST(VerbsLibrary, ChoosesTheNamedDeviceOrSaysWhichExist) {
  const std::vector<RdmaDevice> devices = {{"mlx5_0", false}, {"mlx5_1", false}};
  EXPECT_EQ(choose_rdma_device(devices, "mlx5_1").name, "mlx5_1");
  EXPECT_EQ(choose_rdma_device(devices).name, "mlx5_0");
  const std::string why = error_of(devices, "rdmap0s6");
  EXPECT_NE(why.find("'rdmap0s6' is not on this host; it has mlx5_0, mlx5_1"), std::string::npos) << why;
}

}  // namespace
}  // namespace interlace
