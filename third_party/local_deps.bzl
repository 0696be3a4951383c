"""Local repositories for every dependency: nothing here downloads.

Each rule finds its dependency on this machine at configure time and links it into a small
repository with a BUILD file. Paths can be overridden with environment variables (passed with
--repo_env, see .bazelrc):
  INTERLACE_CUDA_PATH   CUDA toolkit root (default: $CUDA_PATH, /usr/local/cuda-13.0, /usr/local/cuda)
  INTERLACE_PYTHON311   python3.11 interpreter whose headers build the CPython 3.11 extension
  INTERLACE_PYTHON312   python3.12 interpreter whose headers build the cp312 stable-ABI extension
  INTERLACE_PIP_PYTHON  interpreter whose site-packages hold nanobind, nvidia-cutlass and jaxlib
                        (default: <workspace>/.venv/bin/python, made by tools/setup)
"""

def _fail_setup(what, hint):
    fail("interlace: cannot find %s. %s Run tools/setup first." % (what, hint))

def _run(ctx, args, what):
    res = ctx.execute(args)
    if res.return_code != 0:
        _fail_setup(what, "`%s` failed: %s" % (" ".join(args), res.stderr))
    return res.stdout.strip()

def _workspace_dir(ctx):
    return str(ctx.path(Label("//:WORKSPACE")).dirname)

def _pip_python(ctx):
    env = ctx.os.environ.get("INTERLACE_PIP_PYTHON")
    if env:
        return env
    venv = _workspace_dir(ctx) + "/.venv/bin/python"
    if ctx.path(venv).exists:
        return venv
    _fail_setup("the Python environment with nanobind and nvidia-cutlass", "Expected %s." % venv)

def _find_python(ctx, version):
    env = ctx.os.environ.get("INTERLACE_PYTHON" + version.replace(".", ""))
    if env:
        return env
    found = ctx.execute(["sh", "-c", "ls -d $HOME/.pyenv/versions/%s*/bin/python%s 2>/dev/null | sort -V | tail -n 1" % (version, version)]).stdout.strip()
    if found:
        return found
    on_path = ctx.which("python" + version)
    if on_path:
        return str(on_path)
    _fail_setup("Python %s" % version, "Set INTERLACE_PYTHON%s." % version.replace(".", ""))

# ---- CUDA toolkit -------------------------------------------------------------------------------

def _local_cuda_impl(ctx):
    root = ctx.os.environ.get("INTERLACE_CUDA_PATH") or ctx.os.environ.get("CUDA_PATH")
    if not root:
        for candidate in ["/usr/local/cuda-13.0", "/usr/local/cuda"]:
            if ctx.path(candidate + "/bin/nvcc").exists:
                root = candidate
                break
    if not root or not ctx.path(root + "/bin/nvcc").exists:
        _fail_setup("the CUDA toolkit (nvcc)", "Set INTERLACE_CUDA_PATH.")
    ctx.symlink(root + "/include", "include")
    ctx.symlink(root + "/lib64/libcudart_static.a", "lib/libcudart_static.a")
    ctx.file("defs.bzl", 'CUDA_PATH = "%s"\n' % root)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])
cc_library(name = "headers", hdrs = glob(["include/**/*.h", "include/**/*.hpp"]), includes = ["include"])
# cudart linked statically: the extension then needs only the driver (libcuda.so.1) at run time,
# which it loads lazily, so it imports on machines without a GPU.
cc_library(
    name = "cudart_static",
    srcs = ["lib/libcudart_static.a"],
    deps = [":headers"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
)
""")

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["INTERLACE_CUDA_PATH", "CUDA_PATH"],
    local = True,
)

# ---- Python headers -----------------------------------------------------------------------------

def _python_headers_impl(ctx):
    python = _find_python(ctx, ctx.attr.version)
    include = _run(ctx, [python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"], "Python %s headers" % ctx.attr.version)
    ctx.symlink(include, "include")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "headers", hdrs = glob(["include/**/*.h"]), includes = ["include"])
""")

python_headers = repository_rule(
    implementation = _python_headers_impl,
    attrs = {"version": attr.string(mandatory = True)},
    environ = ["INTERLACE_PYTHON311", "INTERLACE_PYTHON312"],
    local = True,
)

# ---- nanobind and CUTLASS/CuTe (from PyPI packages) -----------------------------------------------

def _nanobind_impl(ctx):
    python = _pip_python(ctx)
    root = _run(ctx, [python, "-c", "import nanobind, os; print(os.path.dirname(nanobind.__file__))"], "nanobind")
    ctx.symlink(root + "/include", "include")
    ctx.symlink(root + "/src", "src")
    ctx.symlink(root + "/ext", "ext")
    # nanobind is compiled once per Python target (the defines differ), so this repository only
    # exports its sources; //third_party:nanobind.bzl builds them.
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
filegroup(name = "srcs", srcs = glob(["src/*.cpp"], exclude = ["src/nb_combined.cpp", "src/nb_backend.cpp", "src/nb_ft.cpp"]))
filegroup(name = "private_hdrs", srcs = glob(["src/*.h"]))
cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h", "ext/robin_map/include/**/*.h"]),
    includes = ["include", "ext/robin_map/include"],
)
""")

nanobind_repo = repository_rule(
    implementation = _nanobind_impl,
    environ = ["INTERLACE_PIP_PYTHON"],
    local = True,
)

def _cutlass_impl(ctx):
    python = _pip_python(ctx)
    root = _run(ctx, [python, "-c", "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))"], "nvidia-cutlass")
    ctx.symlink(root + "/source/include", "include")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "cute", hdrs = glob(["include/cute/**", "include/cutlass/**"]), includes = ["include"])
""")

cutlass_repo = repository_rule(
    implementation = _cutlass_impl,
    environ = ["INTERLACE_PIP_PYTHON"],
    local = True,
)

def _xla_ffi_impl(ctx):
    # The XLA FFI headers (header-only, C API + C++ wrappers) that jaxlib ships in jaxlib/include.
    # Handlers built against them run on newer XLA too: the FFI C API is versioned (see docs/DESIGN.md).
    python = _pip_python(ctx)
    root = _run(ctx, [python, "-c", "import jaxlib, os; print(os.path.dirname(jaxlib.__file__))"], "jaxlib (XLA FFI headers)")
    if not ctx.path(root + "/include/xla/ffi/api/ffi.h").exists:
        _fail_setup("the XLA FFI headers", "Expected %s/include/xla/ffi/api/ffi.h (jaxlib from requirements-dev.txt)." % root)
    ctx.symlink(root + "/include/xla", "include/xla")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "headers", hdrs = glob(["include/xla/ffi/api/*.h"]), includes = ["include"])
""")

xla_ffi_repo = repository_rule(
    implementation = _xla_ffi_impl,
    environ = ["INTERLACE_PIP_PYTHON"],
    local = True,
)

# ---- Debian packages: GoogleTest, DLPack, libibverbs --------------------------------------------

def _system_lib_impl(ctx):
    for src, dst in ctx.attr.links.items():
        if not ctx.path(src).exists:
            _fail_setup(src, "It comes from Debian's %s package." % ctx.attr.package)
        ctx.symlink(src, dst)
    ctx.file("BUILD", ctx.attr.build)

system_lib = repository_rule(
    implementation = _system_lib_impl,
    attrs = {
        "links": attr.string_dict(mandatory = True),
        "package": attr.string(mandatory = True),
        "build": attr.string(mandatory = True),
    },
    local = True,
)

def interlace_local_deps():
    local_cuda(name = "local_cuda")
    python_headers(name = "python311", version = "3.11")
    python_headers(name = "python312", version = "3.12")
    nanobind_repo(name = "nanobind")
    cutlass_repo(name = "cutlass")
    xla_ffi_repo(name = "xla_ffi")
    system_lib(
        name = "gtest",
        package = "libgtest-dev",
        links = {
            "/usr/include/gtest": "include/gtest",
            "/usr/lib/x86_64-linux-gnu/libgtest.a": "lib/libgtest.a",
            "/usr/lib/x86_64-linux-gnu/libgtest_main.a": "lib/libgtest_main.a",
        },
        build = """
package(default_visibility = ["//visibility:public"])
cc_library(name = "gtest", hdrs = glob(["include/gtest/**/*.h"]), includes = ["include"],
           srcs = ["lib/libgtest.a"], linkopts = ["-lpthread"])
cc_library(name = "gtest_main", srcs = ["lib/libgtest_main.a"], deps = [":gtest"])
""",
    )
    system_lib(
        name = "dlpack",
        package = "libdlpack-dev",
        links = {"/usr/include/dlpack": "include/dlpack"},
        build = """
package(default_visibility = ["//visibility:public"])
cc_library(name = "dlpack", hdrs = ["include/dlpack/dlpack.h"], includes = ["include"])
""",
    )
    system_lib(
        name = "ibverbs",
        package = "libibverbs-dev",
        links = {"/usr/include/infiniband": "include/infiniband"},
        build = """
package(default_visibility = ["//visibility:public"])
# Headers only: the ibverbs proxy backend loads libibverbs.so.1 at run time when it exists.
cc_library(name = "headers", hdrs = glob(["include/infiniband/*.h"]), includes = ["include"])
""",
    )
