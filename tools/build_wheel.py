"""Packs interlace's Python sources and one compiled extension into a wheel (PEP 427).

Used by the //python:wheel_* Bazel targets; only the standard library, so it runs anywhere.
"""
import argparse
import base64
import hashlib
import os
import zipfile


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--tag", required=True, help="python-abi-platform, e.g. cp312-abi3-linux_x86_64")
    p.add_argument("--extension", required=True, help="the built .so")
    p.add_argument("--extension-name", required=True, help="its file name inside the package")
    p.add_argument("--package-root", required=True, help="sources are taken relative to this folder")
    p.add_argument("sources", nargs="*")
    a = p.parse_args()

    files = {}
    for src in a.sources:
        if src.endswith(".py"):
            rel = os.path.relpath(src, a.package_root)
            with open(src, "rb") as f:
                files[rel] = f.read()
    with open(a.extension, "rb") as f:
        files[f"interlace/{a.extension_name}"] = f.read()

    python_tag, abi_tag, platform_tag = a.tag.split("-", 2)
    requires = ">=3.12" if abi_tag == "abi3" else f"=={python_tag[2]}.{python_tag[3:]}.*"
    dist = f"interlace-{a.version}.dist-info"
    files[f"{dist}/METADATA"] = (
        "Metadata-Version: 2.1\nName: interlace\n"
        f"Version: {a.version}\nSummary: Persistent CUDA kernels that fuse GPU communication with compute\n"
        f"Requires-Python: {requires}\nRequires-Dist: numpy\nRequires-Dist: absl-py\n"
    ).encode()
    files[f"{dist}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: interlace build_wheel.py\nRoot-Is-Purelib: false\nTag: {a.tag}\n"
    ).encode()
    record = [record_line(name, data) for name, data in sorted(files.items())]
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()

    with zipfile.ZipFile(a.out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))  # reproducible
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)


if __name__ == "__main__":
    main()
