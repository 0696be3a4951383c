"""tools/device_ab runs one command under several wheels in alternation, each wheel importable from its
own directory and named in the command: checked here with two copies of the cp312 wheel the build
made, on a Python 3.12 (the GPU machine's), where one is installed."""
import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_each_wheel_runs_the_command_in_turns(tmp_path):
    wheels = glob.glob(os.path.join(ROOT, "bazel-bin/python/interlace-*-cp312-abi3-linux_x86_64.whl"))
    python312 = sorted(glob.glob("/root/.pyenv/versions/3.12*/bin/python3")) + [shutil.which("python3.12") or ""]
    python312 = [p for p in python312 if p and os.path.exists(p)]
    if not wheels or not python312:
        pytest.skip("needs the cp312 wheel (bazel build //python:all) and a Python 3.12")
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").symlink_to(python312[0])  # the script calls python3, as on the GPU machine
    ab = tmp_path / "ab"
    ab.mkdir()
    for name in ("base", "branch"):
        shutil.copy(wheels[0], ab / f"{name}.whl")
    env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}", OUT=str(tmp_path / "out"))
    run = subprocess.run([os.path.join(ROOT, "tools/device_ab"), "--wheels", str(ab), "2", "--", "python3", "-c",
                          "import interlace; print('{}', interlace.__file__)"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [l for l in run.stdout.splitlines() if not l.startswith("=====")]
    assert [l.split()[0] for l in lines] == ["base", "branch", "base", "branch"], run.stdout
    assert all(f"/tmp/interlace_ab/{l.split()[0]}/interlace/" in l for l in lines), run.stdout
    assert (tmp_path / "out" / "ab.log").exists()
