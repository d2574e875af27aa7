#!/usr/bin/env bash
# Downloads, here, numdev's dependencies that the lent GPU machine's image lacks (it has torch 2.11,
# lightning, scipy, tensorboard, einops; not Hydra, OmegaConf or open_clip), as Python 3.12 wheels
# in .whl/ (about 3 MB, ignored by git), pinned to this .venv's versions. A device call carries
# ".whl" and starts with the install line in docs/gpu.md. Run it in the project's root.
set -euo pipefail
grep -qxF "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
pins=$(.venv/bin/python -c "
import importlib.metadata as m
print(' '.join(f'{d}=={m.version(d)}' for d in ('hydra-core', 'omegaconf', 'open_clip_torch', 'ftfy', 'wcwidth')))")
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $pins
# antlr4-python3-runtime (OmegaConf's parser) is published as source only: build its pure-Python wheel.
python3 -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('antlr4-python3-runtime'))")"
ls -la .whl
