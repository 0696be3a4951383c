// libibverbs (and libefa, for EFA), loaded at run time: interlace builds and imports on machines
// without rdma-core, and only a group that needs the network asks for it. VerbsLibrary finds the
// libraries and fills the function table (ibv_api.h) that the real Verbs (ibv_verbs.h) calls, with
// errors that say what is missing.
#pragma once

#include <string>
#include <vector>

#include "interlace/transport/ibv_api.h"

namespace interlace {

struct RdmaDevice {
  std::string name;    // e.g. mlx5_0, rdmap0s6
  bool efa = false;    // an EFA device (SRD); otherwise InfiniBand / RoCE (RC)
};

class VerbsLibrary {
 public:
  // Loads libibverbs.so.1 (and libefa.so.1 where present). Raises interlace::Error, saying what to
  // install, when libibverbs is missing or lacks a function the proxy needs.
  static VerbsLibrary& load();

  // The RDMA devices of this host; raises, naming the library, when it cannot list them.
  std::vector<RdmaDevice> devices() const;
  bool has_efa() const { return efa_ != nullptr; }
  // The functions, for IbvVerbs. Entries for newer or optional functions may be null (ibv_api.h).
  const IbvApi& api() const { return api_; }

 private:
  VerbsLibrary();
  void* verbs_ = nullptr;
  void* efa_ = nullptr;
  IbvApi api_{};
};

// The RDMA devices that `api` lists; none where the kernel has no RDMA support (ENOSYS), as on our
// machines. A device counts as EFA when efadv is available and its name is an EFA one.
std::vector<RdmaDevice> list_rdma_devices(const IbvApi& api);

// The device for the proxy: the one named (`name`), else the first; raises, saying so, when the host
// has none (as on our GPU machines: they have no RDMA devices).
RdmaDevice choose_rdma_device(const std::vector<RdmaDevice>& devices, const std::string& name = "");

}  // namespace interlace
