"""cuda_library: compile .cu files with the local nvcc for sm_90a and wrap them as a cc_library.

Bazel 4 has no CUDA rules, so each .cu file becomes one nvcc action. Its inputs are the file, the
library's headers and every header of its deps, so editing any .cuh rebuilds what includes it.
nvcc's resource report (-Xptxas -v: registers, shared memory, stack frame, spills) is kept next to
each object as <src>.resources.txt, for tools/check_sass and for reading.
"""

load("@local_cuda//:defs.bzl", "CUDA_PATH")

CUDA_ARCH_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a"]

def _cuda_objects_impl(ctx):
    compilation = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps]).compilation_context
    flags = ["-std=c++17", "-O3", "-lineinfo", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC",
             "-Xcompiler=-fvisibility=hidden", "-Xptxas=-v", "-I."] + CUDA_ARCH_FLAGS + ctx.attr.copts
    for inc in compilation.includes.to_list() + compilation.quote_includes.to_list():
        flags.append("-I" + inc)
    for inc in compilation.system_includes.to_list():
        flags += ["-isystem", inc]
    for d in compilation.defines.to_list():
        flags.append("-D" + d)
    inputs = depset(ctx.files.hdrs, transitive = [compilation.headers])
    objects = []
    reports = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_objs/%s/%s.pic.o" % (ctx.label.name, src.basename))
        report = ctx.actions.declare_file("_objs/%s/%s.resources.txt" % (ctx.label.name, src.basename))
        ctx.actions.run_shell(
            inputs = depset([src], transitive = [inputs]),
            outputs = [obj, report],
            command = '"$1"/bin/nvcc "${@:4}" -c "$2" -o "$3" 2> "$3.log" || { cat "$3.log" >&2; exit 1; }; ' +
                      'grep -v "^ptxas info    : Compiling entry\\|^$" "$3.log" > "%s" || true; grep -i "warning\\|error" "$3.log" >&2 || true' % report.path,
            arguments = [CUDA_PATH, src.path, obj.path] + flags,
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objects.append(obj)
        reports.append(report)
    return [
        DefaultInfo(files = depset(objects)),
        OutputGroupInfo(resource_reports = depset(reports)),
    ]

cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc for sm_90a."""
    cuda_objects(
        name = name + "_cuda_objects",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:headers"],
        copts = copts,
    )
    native.filegroup(
        name = name + "_resources",
        srcs = [":" + name + "_cuda_objects"],
        output_group = "resource_reports",
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_cuda_objects"],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart_static"],
        alwayslink = True,
        **kwargs
    )
