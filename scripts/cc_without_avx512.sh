#!/bin/sh
# gcc with AVX-512 turned off: the C kernels as an AVX2-only CPU builds them
exec gcc "$@" -mno-avx512f
