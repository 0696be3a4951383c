"""nanobind_extension: one Python extension module, built for a given CPython.

nanobind is compiled into the module (its static "linked" mode), once per Python target because
the defines differ. With stable_abi, both nanobind and the module build under
Py_LIMITED_API=0x030C0000, which gives a cp312-abi3 module that loads on CPython 3.12 and newer.
"""

def _nanobind_lib(name, python, stable_abi):
    defines = ["Py_LIMITED_API=0x030C0000"] if stable_abi else []
    native.cc_library(
        name = name,
        srcs = ["@nanobind//:srcs", "@nanobind//:private_hdrs"],
        copts = ["-DNB_BUILD", "-DNB_COMPACT_ASSERTIONS", "-fno-strict-aliasing", "-fvisibility=hidden",
                 "-Iexternal/nanobind/include", "-Iexternal/nanobind/ext/robin_map/include", "-Os"],
        defines = defines,
        deps = ["@nanobind//:headers", python],
        alwayslink = True,
    )

def nanobind_extension(name, module_name, srcs, deps = [], python = "@python311//:headers", stable_abi = False):
    """Builds <name>.so; the wheel rule renames it to <module_name> + the interpreter's suffix."""
    _nanobind_lib(name + "_nanobind", python, stable_abi)
    native.cc_binary(
        name = name + ".so",
        srcs = srcs,
        copts = ["-fvisibility=hidden", "-DNB_MODULE_NAME=" + module_name],
        deps = deps + [":" + name + "_nanobind", python],
        linkshared = True,
        linkstatic = True,
        # The module resolves Python symbols from the interpreter that loads it.
        linkopts = ["-Wl,--unresolved-symbols=ignore-in-object-files", "-static-libstdc++", "-static-libgcc"],
    )
