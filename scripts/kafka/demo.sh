#!/usr/bin/env bash
# Live Kafka + Debezium demo (the documented equivalent of `cdcflow demo --source kafka`):
# PostgreSQL → the Debezium PostgreSQL connector (Kafka Connect) → Kafka → cdcflow → Silver of
# two declared tables (accounts, orders), while a live workload runs on PostgreSQL: inserts,
# updates, deletes and, half-way, `ALTER TABLE accounts ADD COLUMN tier text` (evolved into
# Silver: unknown_fields: evolve). Ends with `reconcile --source-snapshot postgres` (every table
# equal to its live source table) and `cdcflow lag` (source commit → Silver commit).
#
#   CDCFLOW_PG_DATA / CDCFLOW_PG_PORT   as for scripts/postgres/start.sh
#   CDCFLOW_KAFKA_PORT / CDCFLOW_CONNECT_PORT   as for scripts/kafka/start.sh
#   DEMO_DIR     working folder (default ./demo/kafka; wiped at start)
#   ROUNDS       workload rounds, one transaction of a few changes per table each (default 40)
# Leaves PostgreSQL, Kafka and Connect running (stop them with scripts/postgres/stop.sh and
# scripts/kafka/stop.sh). Exits non-zero when a table does not reconcile.
set -euo pipefail
cd "$(dirname "$0")/../.."

PG_PORT="${CDCFLOW_PG_PORT:-55432}"
DB="cdcflow_kafka_demo"
DEMO_DIR="${DEMO_DIR:-./demo/kafka}"
ROUNDS="${ROUNDS:-40}"
NAME="cdcflow-demo"

bash scripts/postgres/install.sh
[ -x .venv/bin/cdcflow ] || bash scripts/bootstrap.sh   # the project environment
CDCFLOW_PG_DB="$DB" bash scripts/postgres/start.sh >/dev/null
BOOTSTRAP="$(bash scripts/kafka/start.sh --connect | tail -n 1)"
DSN="postgresql://postgres@127.0.0.1:$PG_PORT/$DB"
export CDCFLOW_PG_PORT="$PG_PORT" CDCFLOW_PG_DB="$DB"

rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR"
DEMO_DIR="$(cd "$DEMO_DIR" && pwd)"
# a fresh start: no connector, slot, publication, topics or tables of an earlier demo
bash scripts/kafka/connector.sh --delete "$NAME" --drop-slot >/dev/null 2>&1 || true
.venv/bin/python - "$BOOTSTRAP" <<'PY'
import sys
from confluent_kafka.admin import AdminClient
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
old = [t for t in admin.list_topics(timeout=10).topics if t.startswith("demo.")]
for future in (admin.delete_topics(old).values() if old else []):
    future.result(timeout=30)
PY
psql "$DSN" -X -q -v ON_ERROR_STOP=1 <<'SQL'
DROP TABLE IF EXISTS accounts, orders;
CREATE TABLE accounts (id integer PRIMARY KEY, owner text, balance numeric(12,2),
                       opened date, updated_at timestamptz);
CREATE TABLE orders (order_id integer PRIMARY KEY, account_id integer, amount numeric(10,2));
INSERT INTO accounts SELECT g, 'owner ' || g, g * 10.25, DATE '2024-01-01' + g, now()
  FROM generate_series(1, 100) g;
SQL

cat >"$DEMO_DIR/cdcflow.yaml" <<YAML
pipeline:
  name: kafka-demo
storage:
  root: $DEMO_DIR/lakehouse
checkpoint:
  location: $DEMO_DIR/lakehouse/_checkpoints/kafka-demo
source:
  type: kafka
  format: debezium
  path: $DEMO_DIR/landing
  max_records_per_trigger: 5000
  kafka:
    bootstrap_servers: $BOOTSTRAP
    topic_pattern: 'demo\.public\..*'
    group_id: cdcflow-kafka-demo
  postgres:            # where reconcile --source-snapshot postgres reads the live tables
    host: 127.0.0.1
    port: $PG_PORT
    dbname: $DB
tables:
  - name: accounts
    keys: [id]
    unknown_fields: evolve       # the column added mid-stream becomes a Silver column
    columns:
      - {name: id, type: integer}
      - {name: owner, type: string, pii: true}
      - {name: balance, type: "decimal(12,2)"}
      - {name: opened, type: date}
      - {name: updated_at, type: timestamp}
  - name: orders
    keys: [order_id]
    columns:
      - {name: order_id, type: integer}
      - {name: account_id, type: integer}
      - {name: amount, type: "decimal(10,2)"}
logging:
  level: WARNING
YAML

# the connector: a snapshot of the 100 accounts, then the stream
bash scripts/kafka/connector.sh --name "$NAME" --tables public.accounts,public.orders \
  --prefix demo --db "$DB" >/dev/null
echo "kafka-demo: connector $NAME running; streaming with cdcflow run --trigger processing-time=1s"
.venv/bin/cdcflow run --config "$DEMO_DIR/cdcflow.yaml" --trigger processing-time=1s \
  >"$DEMO_DIR/run.log" 2>&1 &
RUN=$!
trap 'kill "$RUN" 2>/dev/null || true' EXIT

# the live workload: one transaction per round
for round in $(seq 1 "$ROUNDS"); do
  extra=""
  if [ "$round" -eq $((ROUNDS / 2)) ]; then
    extra="ALTER TABLE accounts ADD COLUMN tier text;"
  fi
  tier=""
  if [ "$round" -gt $((ROUNDS / 2)) ]; then
    tier=", tier = CASE WHEN id % 2 = 0 THEN 'gold' ELSE 'silver' END"
  fi
  psql "$DSN" -X -q -v ON_ERROR_STOP=1 <<SQL
$extra
BEGIN;
INSERT INTO accounts (id, owner, balance, opened, updated_at)
  SELECT 1000 + $round * 5 + g, 'new ' || g, g, CURRENT_DATE, now() FROM generate_series(1, 5) g;
UPDATE accounts SET balance = balance + 1, updated_at = now() $tier
  WHERE id % $((round % 7 + 3)) = 0;
DELETE FROM accounts WHERE id = $round * 2;
INSERT INTO orders SELECT $round * 10 + g, g, $round + g * 0.5 FROM generate_series(1, 10) g;
UPDATE orders SET amount = amount * 2 WHERE order_id % 7 = $((round % 7));
DELETE FROM orders WHERE order_id = $round * 3;
COMMIT;
SQL
  sleep 0.2
done
echo "kafka-demo: workload done ($ROUNDS transactions); waiting for Silver to catch up"

# caught up when every table equals its live source table (Debezium ships within seconds)
for _ in $(seq 1 60); do
  if .venv/bin/cdcflow reconcile --config "$DEMO_DIR/cdcflow.yaml" --source-snapshot postgres \
      --output json >/dev/null 2>&1; then
    break
  fi
  sleep 1
done
kill -TERM "$RUN" 2>/dev/null || true
wait "$RUN" 2>/dev/null || true
trap - EXIT
.venv/bin/cdcflow run --config "$DEMO_DIR/cdcflow.yaml" --trigger available-now >/dev/null
.venv/bin/cdcflow lag --config "$DEMO_DIR/cdcflow.yaml"
.venv/bin/cdcflow reconcile --config "$DEMO_DIR/cdcflow.yaml" --source-snapshot postgres
