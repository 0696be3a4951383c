"""The Bazel wheel targets: names, tags and contents a pip user and the GPU machine rely on."""
import glob
import os
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wheel(pattern):
    found = glob.glob(os.path.join(ROOT, "bazel-bin", "python", pattern))
    if not found:
        pytest.skip(f"no {pattern} under bazel-bin/python: run `bazel build //python:all` (tools/test does)")
    return found[0]


@pytest.mark.parametrize("pattern,tag,module", [
    ("interlace-*-cp311-cp311-linux_x86_64.whl", "cp311-cp311-linux_x86_64", "_interlace.cpython-311-x86_64-linux-gnu.so"),
    ("interlace-*-cp312-abi3-linux_x86_64.whl", "cp312-abi3-linux_x86_64", "_interlace.abi3.so"),
])
def test_wheel_tag_and_contents(pattern, tag, module):
    with zipfile.ZipFile(wheel(pattern)) as z:
        names = set(z.namelist())
        assert f"interlace/{module}" in names
        for py in ("__init__.py", "_frameworks.py", "torch.py", "jax.py", "cupy.py", "bench/__main__.py"):
            assert f"interlace/{py}" in names
        meta = z.read("interlace-0.1.0.dist-info/WHEEL").decode()
        assert f"Tag: {tag}" in meta
        record = z.read("interlace-0.1.0.dist-info/RECORD").decode()
        assert f"interlace/{module},sha256=" in record


def test_stable_abi_module_uses_no_version_specific_symbols():
    """A cp312-abi3 module must not reference CPython internals outside the limited API; the usual
    offenders are _Py* symbols (except the few the limited API itself exports)."""
    import subprocess
    with zipfile.ZipFile(wheel("interlace-*-cp312-abi3-linux_x86_64.whl")) as z, \
            open("/tmp/_interlace_abi3_test.so", "wb") as f:
        f.write(z.read("interlace/_interlace.abi3.so"))
    nm = subprocess.run(["nm", "-D", "--undefined-only", "/tmp/_interlace_abi3_test.so"], capture_output=True,
                        text=True, check=True).stdout
    # The underscore names that CPython's stable ABI does export (Misc/stable_abi.toml, abi_only).
    allowed = {"_Py_Dealloc", "_Py_IncRef", "_Py_DecRef", "_PyObject_New", "_PyObject_NewVar", "_PyObject_GC_New",
               "_PyObject_GC_NewVar", "_PyWeakref_RefType", "_Py_NoneStruct", "_Py_TrueStruct", "_Py_FalseStruct",
               "_Py_NotImplementedStruct", "_Py_EllipsisObject", "_Py_SwappedOp"}
    private = [s.split()[-1] for s in nm.splitlines() if s.split()[-1].startswith("_Py")]
    assert [s for s in private if s not in allowed] == []


def test_abi3_wheel_installs_into_a_clean_venv_and_imports(tmp_path):
    """What a user does (README, "Installing the wheel"): a fresh virtual environment of CPython 3.12,
    pip install of the cp312-abi3 wheel, import. No GPU is needed to import."""
    import subprocess
    import sys
    python312 = os.environ.get("INTERLACE_PYTHON312") or next(
        iter(sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))), None)
    if not python312 or not os.path.exists(python312):
        pytest.skip("no CPython 3.12 here (set INTERLACE_PYTHON312)")
    whl = wheel("interlace-*-cp312-abi3-linux_x86_64.whl")
    venv = tmp_path / "venv"
    subprocess.run([python312, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "-q", whl], capture_output=True, text=True)  # numpy, absl-py from the index
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import interlace, sys; print(interlace.__version__, interlace.gpu_count(), "
            "issubclass(interlace.Error, RuntimeError), sorted(m for m in ('torch', 'jax', 'cupy') if m in sys.modules))")
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0.1.0", "0", "True", "[]"], r.stdout
    del sys
