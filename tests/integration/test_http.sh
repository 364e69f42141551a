#!/bin/sh
# The HTTP API suite (tests/integration/test_http.py) under the venv of http_venv.sh.
# Usage: test_http.sh BUILD_DIR [SCRIPT]   (SCRIPT defaults to test_http.py)
set -eu
here=$(dirname "$0")
py=$(sh "$here/http_venv.sh" "$1")
exec "$py" "$here/${2:-test_http.py}"
