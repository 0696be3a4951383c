#include "interlace/transport/verbs_library.h"

#include <dlfcn.h>
#include <endian.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "interlace/base/error.h"

namespace interlace {
using detail::concat;
namespace {

// The data path is inline in verbs.h (a call through the context's ops, no library symbol); these
// wrap it for the table.
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return ibv_post_send(qp, wr, bad); }
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(qp, wr, bad); }
int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_srq_recv(srq, wr, bad); }
int poll_cq(ibv_cq* cq, int max, ibv_wc* wc) { return ibv_poll_cq(cq, max, wc); }

// ibv_qp_to_qp_ex is exported (rdma-core >= 26); loaded with the rest.
ibv_qp_ex* (*qp_to_qp_ex)(ibv_qp*) = nullptr;

int post_srd_write(ibv_qp* qp, const SrdWrite& w) {
  ibv_qp_ex* qpx = qp_to_qp_ex ? qp_to_qp_ex(qp) : nullptr;
  if (qpx == nullptr) return EOPNOTSUPP;
  ibv_wr_start(qpx);
  qpx->wr_id = w.wr_id;
  qpx->wr_flags = IBV_SEND_SIGNALED;  // EFA refuses unsignaled work requests
  if (w.with_imm) {
    ibv_wr_rdma_write_imm(qpx, w.rkey, w.remote_addr, htobe32(w.imm));
  } else {
    ibv_wr_rdma_write(qpx, w.rkey, w.remote_addr);
  }
  ibv_wr_set_sge_list(qpx, w.sge.length > 0 ? 1 : 0, w.sge.length > 0 ? &w.sge : nullptr);
  ibv_wr_set_ud_addr(qpx, w.ah, w.remote_qpn, w.remote_qkey);
  return ibv_wr_complete(qpx);
}

template <class Fn>
void bind(void* library, const char* name, Fn& slot, std::string* missing) {
  slot = reinterpret_cast<Fn>(::dlsym(library, name));
  if (slot == nullptr && missing != nullptr) *missing += concat(missing->empty() ? "" : ", ", name);
}

}  // namespace

VerbsLibrary::VerbsLibrary() {
  verbs_ = ::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  IL_CHECK(verbs_ != nullptr, "the proxy needs libibverbs (Debian: apt-get install libibverbs1 rdma-core): ",
           ::dlerror());
  std::string missing;
  bind(verbs_, "ibv_get_device_list", api_.get_device_list, &missing);
  bind(verbs_, "ibv_free_device_list", api_.free_device_list, &missing);
  bind(verbs_, "ibv_get_device_name", api_.get_device_name, &missing);
  bind(verbs_, "ibv_open_device", api_.open_device, &missing);
  bind(verbs_, "ibv_close_device", api_.close_device, &missing);
  bind(verbs_, "ibv_query_device", api_.query_device, &missing);
  bind(verbs_, "ibv_query_port", api_.query_port, &missing);
  bind(verbs_, "ibv_query_gid", api_.query_gid, &missing);
  bind(verbs_, "ibv_alloc_pd", api_.alloc_pd, &missing);
  bind(verbs_, "ibv_dealloc_pd", api_.dealloc_pd, &missing);
  bind(verbs_, "ibv_reg_mr", api_.reg_mr, &missing);
  bind(verbs_, "ibv_dereg_mr", api_.dereg_mr, &missing);
  bind(verbs_, "ibv_create_cq", api_.create_cq, &missing);
  bind(verbs_, "ibv_destroy_cq", api_.destroy_cq, &missing);
  bind(verbs_, "ibv_create_srq", api_.create_srq, &missing);
  bind(verbs_, "ibv_destroy_srq", api_.destroy_srq, &missing);
  bind(verbs_, "ibv_create_qp", api_.create_qp, &missing);
  bind(verbs_, "ibv_modify_qp", api_.modify_qp, &missing);
  bind(verbs_, "ibv_destroy_qp", api_.destroy_qp, &missing);
  bind(verbs_, "ibv_create_ah", api_.create_ah, &missing);
  bind(verbs_, "ibv_destroy_ah", api_.destroy_ah, &missing);
  bind(verbs_, "ibv_wc_status_str", api_.wc_status_str, &missing);
  IL_CHECK(missing.empty(), "libibverbs.so.1 lacks ", missing, ": install a newer rdma-core");
  bind(verbs_, "ibv_reg_dmabuf_mr", api_.reg_dmabuf_mr, nullptr);  // optional: newer libraries
  bind(verbs_, "_ibv_query_gid_ex", api_.query_gid_ex, nullptr);
  bind(verbs_, "ibv_qp_to_qp_ex", qp_to_qp_ex, nullptr);
  api_.post_send = post_send;
  api_.post_srd_write = post_srd_write;
  api_.post_recv = post_recv;
  api_.post_srq_recv = post_srq_recv;
  api_.poll_cq = poll_cq;

  efa_ = ::dlopen("libefa.so.1", RTLD_NOW | RTLD_LOCAL);  // optional: EFA only
  if (efa_ != nullptr) {
    std::string efa_missing;
    bind(efa_, "efadv_query_device", api_.efa_query_device, &efa_missing);
    bind(efa_, "efadv_create_qp_ex", api_.efa_create_qp_ex, &efa_missing);
    bind(efa_, "efadv_query_ah", api_.efa_query_ah, &efa_missing);
    if (!efa_missing.empty()) {  // too old to be of use: as if absent
      api_.efa_query_device = nullptr;
      api_.efa_create_qp_ex = nullptr;
      api_.efa_query_ah = nullptr;
      efa_ = nullptr;
    }
  }
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

std::vector<RdmaDevice> VerbsLibrary::devices() const { return list_rdma_devices(api_); }

std::vector<RdmaDevice> list_rdma_devices(const IbvApi& api) {
  int count = 0;
  errno = 0;
  ibv_device** list = api.get_device_list(&count);
  // A kernel without RDMA support (no /sys/class/infiniband) answers ENOSYS: no devices, as here.
  if (list == nullptr && errno == ENOSYS) return {};
  IL_CHECK(list != nullptr, "ibv_get_device_list failed: ", std::strerror(errno));
  std::vector<RdmaDevice> found;
  for (int i = 0; i < count; ++i) {
    RdmaDevice d;
    d.name = api.get_device_name(list[i]);
    // EFA devices are named rdmap*/efa_*; their driver is libefa's.
    d.efa = api.efa_query_device != nullptr && (d.name.rfind("rdmap", 0) == 0 || d.name.rfind("efa", 0) == 0);
    found.push_back(d);
  }
  api.free_device_list(list);
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
