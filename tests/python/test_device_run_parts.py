"""tools/device_run's tests1, tests2 and tests3 must together run every GPU test file, each once: a
file added to tests/gpu and to no part would never run in a split run."""
import glob
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARTS = ("tests1", "tests2", "tests3")


def part(name):
    # device_run's own case statement, evaluated by bash (brace and glob expansion as there).
    script = open(os.path.join(ROOT, "tools", "device_run")).read()
    case = script[script.index('case "$what" in'):script.index("esac") + len("esac")]
    out = subprocess.run(["bash", "-c", f'cd "{ROOT}"; what={name}; {case}; printf "%s\\n" "${{test_files[@]}}"'],
                         check=True, capture_output=True, text=True).stdout
    return out.split()


def test_the_parts_cover_every_gpu_test_file_once():
    files = [f for name in PARTS for f in part(name)]
    every = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tests", "gpu", "test_*.py")))
    assert sorted(files) == every
    assert all(os.path.exists(os.path.join(ROOT, f)) for f in files)
