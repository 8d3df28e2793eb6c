#!/usr/bin/env bash
# Live PostgreSQL demo (the documented equivalent of `cdcflow demo --source postgres`):
# start PostgreSQL, create the slot, run a workload, stream it in micro-batches, reconcile.
#
#   CDCFLOW_PG_DATA / CDCFLOW_PG_PORT   as for start.sh
#   DEMO_DIR       working folder (default ./demo/postgres; wiped at start)
#   CUSTOMERS      customers registered first (default 200)
#   TRANSACTIONS   mixed transactions (default 2000)
# Ends with the source reconciliation table; exits non-zero on any mismatch.
set -euo pipefail
cd "$(dirname "$0")/../.."

PORT="${CDCFLOW_PG_PORT:-55432}"
DB="${CDCFLOW_PG_DB:-cdcflow_demo}"
DEMO_DIR="${DEMO_DIR:-./demo/postgres}"
export CDCFLOW_PG_DB="$DB"

bash scripts/postgres/install.sh
[ -x .venv/bin/cdcflow ] || bash scripts/bootstrap.sh   # the project environment (make demo/test made it)
DSN="$(bash scripts/postgres/start.sh | tail -n 1)"

rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR"
DEMO_DIR="$(cd "$DEMO_DIR" && pwd)"
SLOT="cdcflow_demo"
# a fresh source table and slot for every demo run
psql "$DSN" -X -q -c "DROP TABLE IF EXISTS customers" \
  -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '$SLOT'" >/dev/null

cat >"$DEMO_DIR/cdcflow.yaml" <<YAML
pipeline:
  name: customers
storage:
  root: $DEMO_DIR/lakehouse
checkpoint:
  location: $DEMO_DIR/lakehouse/_checkpoints/customers
source:
  type: postgres
  path: $DEMO_DIR/landing
  postgres:
    host: 127.0.0.1
    port: $PORT
    dbname: $DB
    user: postgres
    slot_name: $SLOT
    table: public.customers
    max_changes_per_batch: 1500
logging:
  level: WARNING
YAML

# 1. the table and the slot exist before the first change (the slot has no initial snapshot)
.venv/bin/cdcflow source-workload --dsn "$DSN" --customers 0 --transactions 0 >/dev/null
.venv/bin/cdcflow run --config "$DEMO_DIR/cdcflow.yaml" --trigger once
# 2. a live workload
.venv/bin/cdcflow source-workload --dsn "$DSN" --customers "${CUSTOMERS:-200}" --transactions "${TRANSACTIONS:-2000}"
# 3. stream it: one micro-batch per staged slot range
.venv/bin/cdcflow run --config "$DEMO_DIR/cdcflow.yaml" --trigger available-now
# 4. Silver vs the live source table, at the LSN the pipeline consumed
.venv/bin/cdcflow reconcile --config "$DEMO_DIR/cdcflow.yaml" --source-snapshot postgres
