#!/usr/bin/env bash
# A throwaway PostgreSQL for the tests (`verified-tools/tests/classify.rs`,
# `verified-tools/tests/postgres.rs`): installs the
# server if it is missing, makes a cluster in a temporary directory owned by
# an unprivileged user (the server refuses to run as root), starts it on a
# free loopback port and exports VT_POSTGRES_URL. A VT_POSTGRES_URL already
# set (a CI service container) is used as it is.
#
#   source .ci/postgres.sh        # from .ci/run: exports VT_POSTGRES_URL and
#                                 # adds the stop to the shell's EXIT trap
#   eval "$(bash .ci/postgres.sh)"  # by hand: prints the export; the server
#                                 # runs on (the stop command is printed too)
#   bash .ci/postgres.sh stop DIR   # stops the server of DIR, removes DIR

vt_pg_main() {
    local bin port dir run_as=() sudo=""

    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

    # The binaries: on the PATH, else Debian's versioned directory.
    vt_pg_bin() {
        if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
            dirname "$(command -v initdb)"
            return
        fi
        local d
        d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1) || true
        if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; fi
    }

    if [ "${1:-}" = "stop" ]; then
        dir=${2:?usage: postgres.sh stop DIR}
        bin=$(vt_pg_bin)
        if [ -f "$dir/postmaster.pid" ] && [ -n "$bin" ]; then
            if [ "$(id -u)" -eq 0 ]; then run_as=(runuser -u "$(stat -c %U "$dir")" --); fi
            "${run_as[@]}" "$bin/pg_ctl" -D "$dir" -m immediate -w stop >/dev/null 2>&1 || true
        fi
        rm -rf "$dir"
        return 0
    fi

    bin=$(vt_pg_bin)
    if [ -z "$bin" ]; then
        echo "== apt-get install postgresql" >&2
        # Debian's package would also create and start a cluster of its own
        # on port 5432: this run needs none.
        $sudo mkdir -p /etc/postgresql-common/createcluster.d
        echo "create_main_cluster = false" |
            $sudo tee /etc/postgresql-common/createcluster.d/vt-no-main.conf >/dev/null
        $sudo apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
        bin=$(vt_pg_bin)
        if [ -z "$bin" ]; then
            echo "postgres.sh: PostgreSQL installed, but no initdb found" >&2
            return 1
        fi
    fi

    # The server will not run as root: as root, it runs as `postgres` (the
    # package's user), made here if a hand-built install lacks it.
    if [ "$(id -u)" -eq 0 ]; then
        if ! id postgres >/dev/null 2>&1; then
            useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin postgres
        fi
        run_as=(runuser -u postgres --)
    fi

    if command -v python3 >/dev/null 2>&1; then
        port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    else
        for port in $(seq 21000 21999); do
            # A port nothing answers on (bash's /dev/tcp connects or fails).
            if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
        done
    fi

    dir=$(mktemp -d /tmp/vt-postgres.XXXXXX)
    if [ "$(id -u)" -eq 0 ]; then chown postgres: "$dir"; fi
    # Trust on loopback and the socket (a throwaway server, reached only from
    # this machine); no fsync: nothing here must survive a crash.
    if ! "${run_as[@]}" "$bin/initdb" -D "$dir" -U postgres -A trust -E UTF8 --locale=C \
        --no-sync >"$dir.initdb.log" 2>&1; then
        echo "postgres.sh: initdb failed:" >&2
        cat "$dir.initdb.log" >&2
        rm -rf "$dir" "$dir.initdb.log"
        return 1
    fi
    rm -f "$dir.initdb.log"
    if ! "${run_as[@]}" "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50" \
        start >/dev/null; then
        echo "postgres.sh: the server did not start:" >&2
        cat "$dir/server.log" >&2 || true
        rm -rf "$dir"
        return 1
    fi
    if [ -x "$bin/pg_isready" ] && ! "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 30; then
        echo "postgres.sh: the server does not answer:" >&2
        cat "$dir/server.log" >&2 || true
        return 1
    fi
    VT_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/postgres"
    VT_POSTGRES_DIR=$dir
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    # Sourced (from .ci/run): start, export, and stop on the shell's exit,
    # after whatever its EXIT trap already does (the Redis server's stop).
    if [ -z "${VT_POSTGRES_URL:-}" ]; then
        vt_pg_main
        export VT_POSTGRES_URL
        echo "== postgres on ${VT_POSTGRES_URL#postgres://postgres@} (data $VT_POSTGRES_DIR)"
        vt_pg_stop() { vt_pg_main stop "$VT_POSTGRES_DIR"; }
        eval "vt_pg_prev=($(trap -p EXIT))"
        trap "${vt_pg_prev[2]:+${vt_pg_prev[2]}; }vt_pg_stop" EXIT
        unset vt_pg_prev
    fi
else
    set -euo pipefail
    if [ "${1:-}" = "stop" ]; then
        vt_pg_main "$@"
    elif [ -n "${VT_POSTGRES_URL:-}" ]; then
        printf "export VT_POSTGRES_URL='%s'\n" "$VT_POSTGRES_URL"
    else
        vt_pg_main
        printf "export VT_POSTGRES_URL='%s'\n" "$VT_POSTGRES_URL"
        printf "# stop it: bash %s stop %s\n" "$0" "$VT_POSTGRES_DIR"
    fi
fi
