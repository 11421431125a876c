# A throwaway PostgreSQL server for the deployment test (run and event storage, as the Helm chart's
# database): Debian's server binaries, a cluster in a temporary folder, trust auth on 127.0.0.1 and
# a free port, fsync off (a test server). Source this file, then call `start_test_postgres`: it
# exports FINETUNE_TEST_POSTGRES_URL and stops and removes the server when the shell exits.
#
#   source .ci/test_postgres.sh && start_test_postgres && python -m pytest -q -m slow \
#       finetune_assets_tests/deploy/test_deployment_backfill.py

start_test_postgres() {
  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  fi
  local bin port
  bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  TEST_PG_DIR=$(mktemp -d /tmp/test-postgres.XXXXXX)
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # initdb and postgres refuse to run as root: as the package's `postgres` user then
  local as=()
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$TEST_PG_DIR"
    as=(runuser -u postgres --)
  fi
  "${as[@]}" "$bin/initdb" -D "$TEST_PG_DIR/data" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
  "${as[@]}" "$bin/pg_ctl" -D "$TEST_PG_DIR/data" -l "$TEST_PG_DIR/server.log" -w -s start -o \
    "-p $port -k $TEST_PG_DIR -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres finetune_test
  export FINETUNE_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/finetune_test"
  TEST_PG_STOP="${as[*]} $bin/pg_ctl -D $TEST_PG_DIR/data -m immediate -s stop"
  trap 'eval "$TEST_PG_STOP" || true; rm -rf "$TEST_PG_DIR"' EXIT
}
