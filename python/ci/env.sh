# Sourced by the other python/ci scripts: strict mode, the repository root as the working
# folder, and the CI folder target/python-ci with its virtual environment (made on first use,
# then reused: what is installed in it stays installed).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export CARGO_TERM_COLOR=never
ci="$root/target/python-ci"
venv="$ci/venv"

# Makes the virtual environment if it is missing, with ${PYTHON:-python3}.
ensure_venv() {
    if [ ! -x "$venv/bin/python" ]; then
        "${PYTHON:-python3}" -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet --upgrade pip
}
