// Passes file descriptors (exported memory handles) between processes of one host: each rank gives
// its own to every other rank of `peers` and takes theirs, over abstract Unix sockets (SCM_RIGHTS)
// named after a token rank 0 draws, and only to and from processes of the same uid (SO_PEERCRED):
// any process of the host can reach an abstract socket, and a handle opens a GPU's memory.
//
// No GPU involved, so the CPU tests run it between processes with ordinary files.
#pragma once

#include <vector>

#include "interlace/runtime/bootstrap.h"

namespace interlace {

// Collective over every rank of the bootstrap, whatever its peers. `peers`: global ranks, ascending,
// `rank` among them; peers must agree (r lists q exactly when q lists r). Returns the received fds
// indexed like `peers` (-1 for this rank), owned by the caller; raises (closing them) if a peer
// does not come within timeout_s or a socket belongs to another user's process.
std::vector<int> exchange_fds(Bootstrap& bootstrap, int rank, const std::vector<int>& peers, int my_fd,
                              double timeout_s);

}  // namespace interlace
