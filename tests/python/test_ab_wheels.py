"""tools/ab_wheels builds a wheel per revision by checking each out in turn: checked here in a scratch
repository, up to the build, that it refuses a dirty tree, and that a failure leaves the tree where it
was (the builds themselves need bazel and are what tools/test already runs)."""
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def scratch_repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "tools/ab_wheels"), repo / "tools/ab_wheels")
    (repo / "file").write_text("one\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return repo


def run(repo, *args):
    # A bazel that fails at once stands in for the build.
    shim = repo.parent / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "bazel").write_text("#!/bin/sh\nexit 1\n")
    (shim / "bazel").chmod(0o755)
    env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}")
    return subprocess.run([str(repo / "tools/ab_wheels"), *args], capture_output=True, text=True, timeout=60, env=env)


def test_usage_without_revisions(tmp_path):
    result = run(scratch_repo(tmp_path))
    assert result.returncode == 2 and "usage" in result.stderr


def test_refuses_a_dirty_tree_before_checking_anything_out(tmp_path):
    repo = scratch_repo(tmp_path)
    (repo / "file").write_text("changed\n")
    result = run(repo, "main")
    assert result.returncode == 2 and "commit or stash" in result.stderr
    assert (repo / "file").read_text() == "changed\n"
    assert not (repo / "device_bundle").exists()


def test_a_failed_build_returns_to_the_starting_branch(tmp_path):
    repo = scratch_repo(tmp_path)
    first = git(repo, "rev-parse", "HEAD").strip()
    result = run(repo, f"old={first}")  # checked out detached, then the build fails
    assert result.returncode != 0
    assert git(repo, "symbolic-ref", "--short", "HEAD").strip() == "main"


def test_an_unknown_revision_fails_on_the_starting_branch(tmp_path):
    repo = scratch_repo(tmp_path)
    result = run(repo, "no-such-revision")
    assert result.returncode != 0
    assert git(repo, "symbolic-ref", "--short", "HEAD").strip() == "main"
