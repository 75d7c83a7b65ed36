"""The compiled fast paths: the ingest hot loop (agents/ingest/processing.py) and the library's
vectorised sampler and blt buffer kernels (stream_dp._fastnoise, issue #35); C API, no build
dependency beyond a C compiler and the Python headers. Everything else is declared in
pyproject.toml.

A setup.py rather than pyproject's ``[[tool.setuptools.ext-modules]]`` table, which setuptools
still calls experimental (a warning at every ``pip install -v``).

Optional: if it does not build (no compiler), the install goes on and the service runs the
pure-Python path, which is authoritative and gives identical results (bit-identical samples
and releases for stream_dp._fastnoise). The test command
(scripts/test, tests/conftest.py) fails when the extension is missing unless
``STREAM_DP_TEST_ALLOW_PURE=1`` says that is expected.
"""

from setuptools import Extension, setup

#: IEEE arithmetic exactly as Python does it (no fused multiply-add, no fast-math); C11.
#: The -Werror flags turn what GCC >= 14 and Clang >= 16 reject anyway into errors everywhere:
#: a call without a prototype once compiled, on Python 3.13, into a hash cut to 32 bits.
COMPILE_ARGS = [
    "-O2",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-std=c11",
    "-Werror=implicit-function-declaration",
    "-Werror=implicit-int",
    "-Werror=int-conversion",
    "-Werror=incompatible-pointer-types",
]

setup(
    ext_modules=[
        Extension(
            "agents.ingest._fastingest",
            sources=["agents/ingest/csrc/fastingest.c", "agents/ingest/csrc/blake2b.c",
                     "agents/ingest/csrc/siphash.c",
                     "agents/ingest/csrc/usertable.c", "agents/ingest/csrc/userlog.c"],
            depends=["agents/ingest/csrc/blake2b.h", "agents/ingest/csrc/siphash.h",
                     "agents/ingest/csrc/usertable.h",
                     "agents/ingest/csrc/userlog.h"],
            include_dirs=["agents/ingest/csrc"],
            extra_compile_args=COMPILE_ARGS,
            optional=True,
        ),
        Extension(
            "stream_dp._fastnoise",
            sources=["stream_dp/csrc/fastnoise.c"],
            # -O3: the element loops vectorise (SSE2 lanes round each operation exactly as the
            # scalar code: still no contraction, no fast-math)
            extra_compile_args=[*COMPILE_ARGS, "-O3"],
            libraries=["m"],
            optional=True,
        ),
    ]
)
