// libibverbs (and libefa, for EFA), loaded at run time: interlace builds and imports on machines
// without rdma-core, and only a group that needs the network asks for it. This is the first piece
// of the real Verbs implementation (verbs.h): finding the library and the RDMA devices, with errors
// that say what is missing.
#pragma once

#include <string>
#include <vector>

namespace interlace {

struct RdmaDevice {
  std::string name;    // e.g. mlx5_0, rdmap0s6
  bool efa = false;    // an EFA device (SRD); otherwise InfiniBand / RoCE (RC)
};

class VerbsLibrary {
 public:
  // Loads libibverbs.so.1 (and libefa.so.1 where present). Raises interlace::Error, saying what to
  // install, when libibverbs is missing.
  static VerbsLibrary& load();

  // The RDMA devices of this host; raises, naming the library, when it cannot list them.
  std::vector<RdmaDevice> devices() const;
  bool has_efa() const { return efa_ != nullptr; }

 private:
  VerbsLibrary();
  void* verbs_ = nullptr;
  void* efa_ = nullptr;
  void* get_device_list_ = nullptr;
  void* free_device_list_ = nullptr;
  void* get_device_name_ = nullptr;
  void* node_type_str_ = nullptr;
};

// The device for the proxy: the one named (`name`), else the first; raises, saying so, when the host
// has none (as on our GPU machines: they have no RDMA devices).
RdmaDevice choose_rdma_device(const std::vector<RdmaDevice>& devices, const std::string& name = "");

}  // namespace interlace
