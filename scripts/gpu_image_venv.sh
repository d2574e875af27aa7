#!/usr/bin/env bash
# Builds, here, a virtual environment with the lent GPU machine's versions where they differ from the
# project's pins (torch 2.11.0 with its Triton 3.6.0, torchvision 0.26.0, lightning 2.6.6; numdev's other
# dependencies, pytest with xdist and timeout, transformers, as that image has them: KINDS.md in the
# device tool's folder), and installs numdev into it as the device call does (the .whl/ wheels into a --target folder on
# PYTHONPATH, then `pip install -e . --no-deps --no-build-isolation`). Rehearsing the GPU call in it
# catches, before GPU minutes are spent, what the image's versions break. It differs from the image
# in Python (3.11 here, 3.12 there, so NumPy 2.4 rather than 2.5) and has no CUDA device.
#
#   bash scripts/gpu_image_venv.sh          # .venv-gpu-image/ (~4.6 GB, a few minutes; ignored by git)
#   PATH=$PWD/.venv-gpu-image/bin:$PATH PYTHONPATH=$PWD/.venv-gpu-image/site \
#     python3 scripts/gpu_call.py --device cpu --out /tmp/rehearsal-image
#
# Run it in the project's root, after scripts/gpu_wheels.sh (it installs .whl/).
set -euo pipefail
venv=.venv-gpu-image
[ -f pyproject.toml ] && [ -d .git ] || { echo "gpu_image_venv: error: run it in numdev's checkout (its root: pyproject.toml, .git)" >&2; exit 2; }
[ -d .whl ] || { echo "gpu_image_venv: error: no .whl/ here: run bash scripts/gpu_wheels.sh first" >&2; exit 2; }
grep -qxF "/$venv/" .git/info/exclude 2>/dev/null || echo "/$venv/" >> .git/info/exclude
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# numdev's own dependencies (pyproject.toml) that the image has, unpinned, less those .whl/ carries and
# torch/torchvision at the image's versions; open_clip's and the tests' that the image has too
deps=$(python3 -c "
import re, tomllib
carried = {'torch', 'torchvision', 'hydra-core', 'omegaconf', 'open-clip-torch'}
names = [re.split(r'[<>=!~ \[;]', d)[0] for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']]
print(' '.join(n for n in names if n.lower() not in carried))")
"$venv/bin/python" -m pip install -q torch==2.11.0 torchvision==0.26.0 lightning==2.6.6 pytorch-lightning==2.6.6 \
  safetensors==0.8.0 $deps regex timm huggingface-hub einops transformers pytest pytest-xdist pytest-timeout \
  "setuptools<82" wheel
"$venv/bin/python" -m pip install -q --no-index --no-deps --no-compile --target "$venv/site" .whl/*.whl
PYTHONPATH="$venv/site" "$venv/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e .
PYTHONPATH="$venv/site" "$venv/bin/python" -c "
import lightning, numpy, torch, triton, numdev
print(f'gpu_image_venv: {\"$venv\"}: torch {torch.__version__}, Triton {triton.__version__}, lightning {lightning.__version__}, '
      f'NumPy {numpy.__version__}, numdev from {numdev.__file__}')"
