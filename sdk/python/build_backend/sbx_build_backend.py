"""sbx_build_backend: setuptools' PEP 517 backend, with an offline fallback.

setuptools before 70.1 needs the separate `wheel` package to build wheels. With
`pip install --no-build-isolation` (no network) that package may be missing; then
this module builds the wheel of this pure-Python package itself with zipfile, from
the metadata in pyproject.toml. Everything else is setuptools."""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile

from setuptools import build_meta as _st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setuptools_can_wheel() -> bool:
    try:
        import setuptools.command.bdist_wheel  # noqa: F401  (setuptools >= 70.1)

        return True
    except ImportError:
        pass
    try:
        import wheel.bdist_wheel  # noqa: F401

        return True
    except ImportError:
        return False


get_requires_for_build_sdist = _st.get_requires_for_build_sdist
build_sdist = _st.build_sdist

if _setuptools_can_wheel():
    get_requires_for_build_wheel = _st.get_requires_for_build_wheel
    prepare_metadata_for_build_wheel = _st.prepare_metadata_for_build_wheel
    build_wheel = _st.build_wheel
    if hasattr(_st, "build_editable"):
        build_editable = _st.build_editable
        get_requires_for_build_editable = _st.get_requires_for_build_editable
        prepare_metadata_for_build_editable = _st.prepare_metadata_for_build_editable
else:

    def get_requires_for_build_wheel(config_settings=None):  # type: ignore[no-untyped-def]
        return []

    def _project() -> dict:
        try:
            import tomllib
        except ImportError:  # Python < 3.11 without `wheel`
            raise RuntimeError("building this wheel offline needs Python >= 3.11 or the `wheel` package")
        with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
            return tomllib.load(f)["project"]

    def _digest(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):  # type: ignore[no-untyped-def]
        proj = _project()
        name, version = proj["name"], proj["version"]
        dist = name.replace("-", "_")
        info = f"{dist}-{version}.dist-info"
        meta = [
            "Metadata-Version: 2.1",
            f"Name: {name}",
            f"Version: {version}",
            f"Summary: {proj.get('description', '')}",
            f"Requires-Python: {proj.get('requires-python', '')}",
        ]
        meta += [f"Classifier: {c}" for c in proj.get("classifiers", [])]
        readme = proj.get("readme")
        body = ""
        if readme:
            meta.append("Description-Content-Type: text/markdown")
            with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
                body = "\n" + f.read()
        files = {}
        src = os.path.join(ROOT, "src")
        for pkg in ("sandbox_shim",):
            for dp, _dns, fns in os.walk(os.path.join(src, pkg)):
                for fn in sorted(fns):
                    if fn.endswith((".py", ".typed")):
                        full = os.path.join(dp, fn)
                        with open(full, "rb") as f:
                            files[os.path.relpath(full, src).replace(os.sep, "/")] = f.read()
        files[f"{info}/METADATA"] = ("\n".join(meta) + "\n" + body).encode()
        files[f"{info}/WHEEL"] = (
            "Wheel-Version: 1.0\nGenerator: sbx_build_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ).encode()
        files[f"{info}/top_level.txt"] = b"sandbox_shim\n"
        record = "".join(f"{p},{_digest(d)},{len(d)}\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
        files[f"{info}/RECORD"] = record.encode()
        wheel_name = f"{dist}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
            for p, d in files.items():
                z.writestr(zipfile.ZipInfo(p, (2020, 1, 1, 0, 0, 0)), d)
        return wheel_name
