"""Starts one process per GPU on this host with torchrun's variables, and waits for them."""
import os
import socket
import subprocess
import sys

# NVLink multicast can take shared GPUs down; interlace never uses it, and the baselines must not either.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(argv, world_size, timeout_s, extra_env=None):
    """Runs `python argv...` as ranks 0..world_size-1; returns [(returncode, output)] by rank."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, **SAFE_ENV, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONUNBUFFERED="1", **(extra_env or {}))
        procs.append(subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += f"\n[launcher] killed after {timeout_s} s"
        results.append((p.returncode, out))
    return results
