"""Starts one process per GPU on this host with torchrun's variables, and waits for them."""
import os
import socket
import subprocess
import sys
import threading
import time

# NVLink multicast can take shared GPUs down; interlace never uses it, and the baselines must not either.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _drain(pipe, chunks):
    with pipe:
        for chunk in iter(lambda: pipe.read(1 << 16), ""):
            chunks.append(chunk)


def run_ranks(argv, world_size, timeout_s, extra_env=None):
    """Runs `python argv...` as ranks 0..world_size-1; returns [(returncode, output)] by rank.
    Ranks still running timeout_s after the start are all killed, and their output says so."""
    port = free_port()
    procs, outputs, readers = [], [], []
    try:
        for rank in range(world_size):
            env = dict(os.environ, **SAFE_ENV, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       PYTHONUNBUFFERED="1", **(extra_env or {}))
            procs.append(subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, errors="replace"))
            # Every pipe is read as it fills: a rank blocked on a full pipe that another rank waits for
            # would otherwise deadlock them both.
            outputs.append([])
            readers.append(threading.Thread(target=_drain, args=(procs[-1].stdout, outputs[-1]), daemon=True))
            readers[-1].start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        # Past the deadline (or on an error here), no rank outlives the run: peers of a hung rank
        # would wait for it forever.
        late = [p.poll() is None for p in procs]
        for p, killed in zip(procs, late):
            if killed:
                p.kill()
        for p in procs:
            p.wait()
        for t in readers:
            t.join(timeout=10)  # a rank's child could hold the pipe open; take what came
    return [(p.returncode, "".join(out) + (f"\n[launcher] killed after {timeout_s} s" if killed else ""))
            for p, out, killed in zip(procs, outputs, late)]


def expect_ranks_passed(results, ranks=None) -> str:
    """For tests: raises AssertionError with every rank's output unless the given ranks (default:
    all) of run_ranks' results exited 0; otherwise prints that output and returns it."""
    report = "\n".join(f"----- rank {r} exit {rc}\n{out}" for r, (rc, out) in enumerate(results))
    must = range(len(results)) if ranks is None else ranks
    if not all(results[r][0] == 0 for r in must):
        raise AssertionError(report)
    print(report)
    return report


def expect_error(fn, *needles, errors=None) -> str:
    """For rank workers: fn must raise (interlace.Error, or one of `errors`) with every needle in its
    message, a needle being a string or a tuple of alternatives (the message names the problem in
    one of these words). Returns the message."""
    if errors is None:
        from interlace import Error  # here: launching ranks needs no interlace build
        errors = (Error,)
    rank = os.environ.get("RANK", "?")
    try:
        fn()
    except errors as e:
        text = str(e)
        for needle in needles:
            alternatives = needle if isinstance(needle, tuple) else (needle,)
            assert any(a in text for a in alternatives), f"rank {rank}: the error lacks {needle!r}: {text}"
        return text
    raise AssertionError(f"rank {rank}: no error; expected one mentioning {needles}")


def run_scenario(worker, scenario, world_size=None, timeout_s=600, args=()):
    """For GPU tests: `python worker scenario *args` on world_size ranks (default: every visible GPU);
    raises with every rank's output unless all of them exit 0, else returns run_ranks' results."""
    if world_size is None:
        import torch  # here: launching ranks needs no torch otherwise
        world_size = torch.cuda.device_count()
    results = run_ranks([worker, scenario, *map(str, args)], world_size, timeout_s)
    expect_ranks_passed(results)
    return results
