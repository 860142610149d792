# The Python environment the PyTorch baselines run in: torch 2.11.0 (the version tch pins)
# and tokenizers, built once under the cache. Sourced by bench/run-pytorch-baseline.sh and
# bench/profile.sh; sets $venv.
venv="${FERROTRAIN_CACHE:-$HOME/.cache/ferrotrain}/venv-torch"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, tokenizers" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.11.0 tokenizers
fi
