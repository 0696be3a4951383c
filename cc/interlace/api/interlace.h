// Interlace's public C++ API: create a Group, then call ops on framework-neutral TensorViews.
//
//   interlace::GroupOptions options;           // rank, world size, master from the launcher's env
//   options.heap_bytes = 1 << 30;
//   interlace::Group group(options);
//   interlace::all_gather(group, out, inp, stream);
//   interlace::all_reduce(group, out, inp, stream);  // or reduce_scatter(group, out, inp, stream)
//   ...
//   cudaStreamSynchronize(stream);
//   group.check();                              // raises if a peer never arrived
#pragma once

#include "interlace/attention/attention.h"
#include "interlace/base/error.h"
#include "interlace/base/tensor.h"
#include "interlace/gemm/gemm.h"
#include "interlace/ops/ag_gemm/launch.h"
#include "interlace/ops/all_gather/launch.h"
#include "interlace/ops/all_gather/plan.h"
#include "interlace/ops/gemm_ar/launch.h"
#include "interlace/ops/gemm_rs/launch.h"
#include "interlace/ops/moe/launch.h"
#include "interlace/ops/reduce/launch.h"
#include "interlace/ops/reduce/plan.h"
#include "interlace/ops/ring_attention/launch.h"
#include "interlace/runtime/group.h"
