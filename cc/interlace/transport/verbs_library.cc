#include "interlace/transport/verbs_library.h"

#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "interlace/base/error.h"

namespace interlace {
using detail::concat;

VerbsLibrary::VerbsLibrary() {
  verbs_ = ::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  IL_CHECK(verbs_ != nullptr, "the proxy needs libibverbs (Debian: apt-get install libibverbs1 rdma-core): ",
           ::dlerror());
  efa_ = ::dlopen("libefa.so.1", RTLD_NOW | RTLD_LOCAL);  // optional: EFA only
  get_device_list_ = ::dlsym(verbs_, "ibv_get_device_list");
  free_device_list_ = ::dlsym(verbs_, "ibv_free_device_list");
  get_device_name_ = ::dlsym(verbs_, "ibv_get_device_name");
  IL_CHECK(get_device_list_ && free_device_list_ && get_device_name_,
           "libibverbs.so.1 lacks ibv_get_device_list/ibv_free_device_list/ibv_get_device_name");
}

VerbsLibrary& VerbsLibrary::load() {
  static std::once_flag once;
  static VerbsLibrary* library = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    try {
      library = new VerbsLibrary();  // kept for the life of the process, as the loaded library is
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!library) throw Error(failure);
  return *library;
}

std::vector<RdmaDevice> VerbsLibrary::devices() const {
  using GetList = ibv_device** (*)(int*);
  using FreeList = void (*)(ibv_device**);
  using GetName = const char* (*)(ibv_device*);
  int count = 0;
  errno = 0;
  ibv_device** list = reinterpret_cast<GetList>(get_device_list_)(&count);
  // A kernel without RDMA support (no /sys/class/infiniband) answers ENOSYS: no devices, as here.
  if (list == nullptr && errno == ENOSYS) return {};
  IL_CHECK(list != nullptr, "ibv_get_device_list failed: ", std::strerror(errno));
  std::vector<RdmaDevice> found;
  for (int i = 0; i < count; ++i) {
    RdmaDevice d;
    d.name = reinterpret_cast<GetName>(get_device_name_)(list[i]);
    // EFA devices are named rdmap*/efa_*; their driver is libefa's.
    d.efa = efa_ != nullptr && (d.name.rfind("rdmap", 0) == 0 || d.name.rfind("efa", 0) == 0);
    found.push_back(d);
  }
  reinterpret_cast<FreeList>(free_device_list_)(list);
  return found;
}

RdmaDevice choose_rdma_device(const std::vector<RdmaDevice>& devices, const std::string& name) {
  IL_CHECK(!devices.empty(), "this host has no RDMA devices (no InfiniBand, RoCE or EFA adapter): ranks on other "
           "nodes cannot be reached through the proxy");
  if (name.empty()) return devices.front();
  std::string names;
  for (const auto& d : devices) {
    if (d.name == name) return d;
    names += concat(names.empty() ? "" : ", ", d.name);
  }
  IL_FAIL("RDMA device '", name, "' is not on this host; it has ", names);
}

}  // namespace interlace
