"""The build's one native part, optional: the Mse search's measure on the CPU (qcli/codec/_search.c,
qcli.codec.search_loop). Everything else is in pyproject.toml. Where no C compiler is found the build
goes on without it and the search takes torch's passes, slower, to the same bytes."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Every operation rounds on its own, as torch's do: no contraction into fused multiply-adds and no
# fast-math licence. -fno-trapping-math lets the compiler turn the loop's selects into vector blends (no
# result changes: qcli never reads the floating-point exception flags).
GCC_FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math"]


class BuildExt(build_ext):
    def build_extensions(self) -> None:
        if self.compiler.compiler_type != "msvc":
            for extension in self.extensions:
                extension.extra_compile_args = GCC_FLAGS
        super().build_extensions()


setup(
    ext_modules=[Extension("qcli.codec._search", ["qcli/codec/_search.c"], optional=True)],
    cmdclass={"build_ext": BuildExt},
)
