#!/usr/bin/env bash
# Print the path of a working interpreter for Python X.Y (argument), or fail with a clear message.
# pyenv shims answer "pythonX.Y" only when X.Y is a selected version, so we also look in pyenv's tree.
set -u
want="$1"
for cand in "python$want" "$HOME/.pyenv/versions/$want"*/bin/"python$want" /usr/local/bin/"python$want" /usr/bin/"python$want"; do
  if "$cand" -c "import sys; assert sys.version_info[:2] == tuple(map(int, '$want'.split('.')))" >/dev/null 2>&1; then
    command -v "$cand" 2>/dev/null || echo "$cand"
    exit 0
  fi
done
if command -v pyenv >/dev/null 2>&1; then
  v=$(pyenv versions --bare 2>/dev/null | grep -E "^$want(\.|$)" | tail -1)
  if [ -n "$v" ]; then echo "$(pyenv root)/versions/$v/bin/python$want"; exit 0; fi
fi
echo "error: Python $want not found; install it (e.g. 'pyenv install $want') or set PY${want/./} to its path" >&2
exit 1
