"""Build configuration for the optional C launch accelerator; everything else is in
pyproject.toml. If the extension cannot be built (no compiler), nbjit works without it."""
from setuptools import Extension, setup

setup(
    ext_modules=[Extension("nbjit.gpu._launcher", ["nbjit/gpu/_launcher.c"], optional=True, py_limited_api=True,
                           define_macros=[("Py_LIMITED_API", "0x030A0000")])],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
