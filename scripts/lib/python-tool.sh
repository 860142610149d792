# Sourced: ensure_python_tool VENV PACKAGE VERSION installs PACKAGE==VERSION from PyPI into its
# own venv at VENV, once (a marker file holds the installed version; another version starts
# the venv afresh). Returns 1 with the reason on stderr when python3 -m venv or pip fails.
ensure_python_tool() {
  local venv="$1" package="$2" version="$3"
  [[ "$(cat "$venv/.complete" 2>/dev/null)" == "$version" ]] && return 0
  echo "installing $package==$version into $venv" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" || { echo "python3 -m venv failed" >&2; return 1; }
  "$venv/bin/pip" install --quiet "$package==$version" >&2 || { echo "pip install $package failed" >&2; return 1; }
  echo "$version" > "$venv/.complete"
}
