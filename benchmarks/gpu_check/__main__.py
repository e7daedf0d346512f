"""`python -m benchmarks.gpu_check`: see the package's docstring."""

from benchmarks.gpu_check import main

main()
