// The libibverbs / libefa functions the real Verbs (ibv_verbs.h) calls, as a table of function
// pointers. VerbsLibrary fills it from the libraries it loads at run time (dlopen); the CPU tests
// fill it with fakes, so connection setup and the data path are tested without an RDMA device.
//
// Most entries are the libraries' exported functions, with their exact signatures. The data path
// (post, poll) is inline in verbs.h, a call through the device context's ops; the real table wraps
// those inlines in plain functions (verbs_library.cc) so that a fake can stand in for them too.
#pragma once

#include <infiniband/efadv.h>
#include <infiniband/verbs.h>

#include <cstdint>

namespace interlace {

// One RDMA write on an EFA SRD queue pair (datagram addressing: address handle, queue pair number
// and qkey of the receiver), posted through the extended work-request API (ibv_wr_*), the only one
// EFA offers RDMA writes through.
struct SrdWrite {
  uint64_t wr_id;
  bool with_imm;
  uint32_t imm;       // host order; the wrapper converts it to the wire's big-endian
  ibv_sge sge;        // length 0: no payload (the immediate alone)
  uint32_t rkey;
  uint64_t remote_addr;
  ibv_ah* ah;
  uint32_t remote_qpn;
  uint32_t remote_qkey;
};

struct IbvApi {
  // libibverbs: always there once the library loads.
  ibv_device** (*get_device_list)(int* count);
  void (*free_device_list)(ibv_device** list);
  const char* (*get_device_name)(ibv_device* device);
  ibv_context* (*open_device)(ibv_device* device);
  int (*close_device)(ibv_context* context);
  int (*query_device)(ibv_context* context, ibv_device_attr* attr);
  // The exported ibv_query_port (the compatible one: it fills ibv_port_attr up to `flags`).
  int (*query_port)(ibv_context* context, uint8_t port, ibv_port_attr* attr);
  int (*query_gid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid);
  ibv_pd* (*alloc_pd)(ibv_context* context);
  int (*dealloc_pd)(ibv_pd* pd);
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access);
  int (*dereg_mr)(ibv_mr* mr);
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int vector);
  int (*destroy_cq)(ibv_cq* cq);
  ibv_srq* (*create_srq)(ibv_pd* pd, ibv_srq_init_attr* attr);
  int (*destroy_srq)(ibv_srq* srq);
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  int (*destroy_qp)(ibv_qp* qp);
  ibv_ah* (*create_ah)(ibv_pd* pd, ibv_ah_attr* attr);
  int (*destroy_ah)(ibv_ah* ah);
  const char* (*wc_status_str)(ibv_wc_status status);

  // libibverbs, newer releases only: null when the loaded library lacks them.
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                           int access);  // rdma-core >= 34
  int (*query_gid_ex)(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entry_size);  // _ibv_query_gid_ex, rdma-core >= 32

  // libefa (efadv): null when libefa is absent.
  int (*efa_query_device)(ibv_context* context, efadv_device_attr* attr, uint32_t inlen);
  ibv_qp* (*efa_create_qp_ex)(ibv_context* context, ibv_qp_init_attr_ex* attr, efadv_qp_init_attr* efa_attr,
                              uint32_t inlen);
  int (*efa_query_ah)(ibv_ah* ah, efadv_ah_attr* attr, uint32_t inlen);

  // The data path (inline in verbs.h; wrapped). Return 0 or an errno value, as the verbs do.
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
  int (*post_srd_write)(ibv_qp* qp, const SrdWrite& write);
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
  int (*post_srq_recv)(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
  int (*poll_cq)(ibv_cq* cq, int max, ibv_wc* wc);  // completions taken, or < 0 on failure
};

}  // namespace interlace
