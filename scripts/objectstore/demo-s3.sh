#!/usr/bin/env bash
# `make demo-s3`: the demo with the customers lakehouse and its checkpoint on S3 — the local
# S3-compatible server of scripts/objectstore/server.sh (moto), started when not running, and
# a bucket `cdcflow-demo` on it. The server's endpoint and (throw-away) credentials go to
# .objectstore/s3/env: `source .objectstore/s3/env` before pasting the demo's next commands.
# Extra arguments go to `cdcflow demo` (e.g. --events 20000).
set -euo pipefail
cd "$(dirname "$0")/../.."
line="$(bash scripts/objectstore/server.sh start s3)"
endpoint="${line#s3: }"
cat >.objectstore/s3/env <<ENV
export AWS_ENDPOINT_URL=$endpoint
export AWS_ALLOW_HTTP=true
export AWS_ACCESS_KEY_ID=cdcflow-demo
export AWS_SECRET_ACCESS_KEY=cdcflow-demo
export AWS_REGION=us-east-1
ENV
# shellcheck disable=SC1091
source .objectstore/s3/env
.venv/bin/python - "$endpoint" <<'PY'
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(urllib.request.Request(f"{sys.argv[1]}/cdcflow-demo", method="PUT"))
except urllib.error.HTTPError as exc:  # 409: the bucket exists already
    if exc.code != 409:
        raise
PY
echo "s3: lakehouse and checkpoint under s3://cdcflow-demo/demo ($endpoint);" \
  "for the next commands: source .objectstore/s3/env"
exec .venv/bin/cdcflow demo --dir demo-s3 --storage-root s3://cdcflow-demo/demo "$@"
