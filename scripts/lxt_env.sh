#!/usr/bin/env bash
# Build the cached environment in which tests/test_attnlrp_lxt.py runs LXT 2.1, the
# reference implementation of AttnLRP and CP-LRP.
#
# LXT 2.1 needs transformers 4.x and monkey-patches transformers for the whole process,
# so it never runs inside the project's environment: it gets a virtual environment of its
# own, with transformers 4.57 (and the hub and tokenizers versions it takes) installed
# there. torch, torchvision and the numeric stack are shared with the project's
# environment through a .pth file (the same torch on both sides, and no second multi-GB
# install); the environment's own packages come first on sys.path, so its transformers
# shadows the project's.
#
# Usage: scripts/lxt_env.sh [PROJECT_PYTHON]   (default: the python3 on PATH)
# Result: ~/.cache/explain-lxt/venv (override with EXPLAIN_LXT_ENV), marked complete by a
# file named `ready` in it. Rerunning rebuilds from scratch.
set -euo pipefail
project_python="${1:-python3}"
env_dir="${EXPLAIN_LXT_ENV:-$HOME/.cache/explain-lxt/venv}"
rm -rf "$env_dir"
mkdir -p "$(dirname "$env_dir")"
"$project_python" -m venv "$env_dir"
shared=$("$project_python" -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))")
site=$("$env_dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$shared" > "$site/explain-shared.pth"
pip=("$env_dir/bin/python" -m pip install --quiet --ignore-installed)
"${pip[@]}" 'transformers==4.57.*' 'huggingface-hub<1.0' 'tokenizers<0.23'
"${pip[@]}" --no-deps lxt==2.1 zennit==0.5.1 tabulate
"$env_dir/bin/python" -c "import lxt.efficient, transformers, torch; print('lxt ready: transformers', transformers.__version__, 'torch', torch.__version__)"
touch "$env_dir/ready"
