"""tools/device_run's tests1 and tests2 must together run every GPU test file, each once: a file
added to tests/gpu and to neither half would never run in a split run."""
import glob
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def half(name):
    # device_run's own case statement, evaluated by bash (brace and glob expansion as there).
    script = open(os.path.join(ROOT, "tools", "device_run")).read()
    case = script[script.index('case "$what" in'):script.index("esac") + len("esac")]
    out = subprocess.run(["bash", "-c", f'cd "{ROOT}"; what={name}; {case}; printf "%s\\n" "${{test_files[@]}}"'],
                         check=True, capture_output=True, text=True).stdout
    return out.split()


def test_the_two_halves_cover_every_gpu_test_file_once():
    first, second = half("tests1"), half("tests2")
    every = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tests", "gpu", "test_*.py")))
    assert sorted(first + second) == every
    assert all(os.path.exists(os.path.join(ROOT, f)) for f in first + second)
