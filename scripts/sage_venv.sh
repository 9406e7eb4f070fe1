#!/usr/bin/env bash
# SAGE in a virtualenv of its own, for the contract tests (never the project's .venv).
#   scripts/sage_venv.sh SAGE_SRC [DEST]   -> prints the path of a Python that can `import sage`
# SAGE_SRC is a SAGE checkout (CI: ../shared/upstream/sage). It is copied first (CI lays shared/
# out read-only and pip builds in the source tree), then installed editable with its [dev]
# extra, as SAGE's own docs do, so its bundled config/models.yaml is found. The copy and the
# venv are rebuilt only when SAGE_SRC's files change (a hash of their paths and contents).
set -euo pipefail
src="${1:?usage: scripts/sage_venv.sh SAGE_SRC [DEST]}"
dest="${2:-.sage}"
[ -f "$src/pyproject.toml" ] && [ -d "$src/src/sage" ] || {
  echo "SAGE_SRC=$src is not a SAGE checkout (no pyproject.toml and src/sage/ there): point it at one" >&2; exit 2; }
PY="${PYTHON:-python3}"
want=$(cd "$src" && find . -type f -not -path './.git/*' -not -name '*.pyc' -print0 | sort -z \
       | xargs -0 sha256sum | sha256sum | cut -c1-16)
if [ -x "$dest/venv/bin/python" ] && [ "$(cat "$dest/stamp" 2>/dev/null)" = "$want" ] \
   && "$dest/venv/bin/python" -c 'import sage.orchestrator.model_router, sklearn, joblib' 2>/dev/null; then
  echo "$(cd "$dest" && pwd)/venv/bin/python"; exit 0
fi
echo "Installing SAGE from $src into $dest/venv (its own virtualenv; about 3 minutes the first time)" >&2
rm -rf "$dest/src" "$dest/venv" "$dest/stamp"
mkdir -p "$dest"
cp -R "$src" "$dest/src"
chmod -R u+w "$dest/src"
"$PY" -m venv "$dest/venv"
"$dest/venv/bin/pip" install -q --disable-pip-version-check -e "$dest/src[dev]" >&2
"$dest/venv/bin/python" -c 'import sage.orchestrator.model_router, sage.rl.policy, sklearn, joblib' >&2
echo "$want" > "$dest/stamp"
echo "$(cd "$dest" && pwd)/venv/bin/python"
