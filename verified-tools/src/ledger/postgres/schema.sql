-- The schema of verified-tools' PostgresLedger, version 2, in the schema
-- "public" with the prefix "vt_" (the defaults). One transaction: run it
-- as one script (psql -1 -f, or one simple-query message).
SELECT pg_advisory_xact_lock(1987341415);

DO $$
BEGIN
    IF to_regnamespace('"public"') IS NULL THEN
        CREATE SCHEMA "public";
    END IF;
END
$$;

-- Fences: every claim takes the next one. CACHE 1 (the default): values
-- are handed out in order across sessions.
CREATE SEQUENCE IF NOT EXISTS "public"."vt_fence" AS bigint MINVALUE 1 NO CYCLE CACHE 1;

-- No CHECK constraints: PostgreSQL prepares them for every statement that
-- writes, which cost more than the rest of the write (the functions below
-- are the only writers, and keep the columns consistent with the state).
CREATE TABLE IF NOT EXISTS "public"."vt_records" (
    key bytea PRIMARY KEY,            -- the idempotency key, 16 bytes big-endian
    fingerprint bytea NOT NULL,       -- the payload digest, 16 bytes big-endian
    state text NOT NULL,              -- held, in_doubt, settled, completed
    fence bigint NOT NULL,            -- the last claim's (the holder's while held)
    lease_end timestamptz,            -- when the hold ends (held only)
    attempts bigint NOT NULL,         -- attempts dispatched under the key
    after_ok boolean NOT NULL,        -- the last attempt answered OK, unconfirmed
    settle_at timestamptz,            -- when the last attempt settles (NULL: never)
    value bytea,                      -- a completed call's value (NULL: not recorded)
    expires_at timestamptz            -- completed and settled only
);

CREATE INDEX IF NOT EXISTS "vt_records_expiry" ON "public"."vt_records" (expires_at)
    WHERE expires_at IS NOT NULL;

CREATE INDEX IF NOT EXISTS "vt_records_open" ON "public"."vt_records" (state)
    WHERE expires_at IS NULL;

-- Claims p_key (or p_previous, the previous time bucket's key, when a live
-- record of the same call is there). Durations in microseconds; a settle
-- time of -1 is never. Answers one row: o_kind 1 fresh (o_fence), 2 resumed
-- (o_fence, o_attempts, o_after_ok, o_left_us: settles in, -1 never),
-- 3 completed (o_value, NULL: not recorded), 4 in flight (o_left_us: lease
-- left), 5 another payload; o_which 0 for p_key, 1 for p_previous.
CREATE OR REPLACE FUNCTION "public"."vt_claim"(
    p_key bytea, p_fingerprint bytea, p_previous bytea, p_previous_fingerprint bytea,
    p_lease_us bigint, p_attempts bigint, p_after_ok boolean, p_settle_us bigint,
    OUT o_kind integer, OUT o_which integer, OUT o_fence bigint, OUT o_attempts bigint,
    OUT o_after_ok boolean, OUT o_left_us bigint, OUT o_value bytea)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_key bytea := p_key;
    v_fingerprint bytea := p_fingerprint;
    v_locked boolean := false;
    r "public"."vt_records"%ROWTYPE;
BEGIN
    o_which := 0;
    IF p_previous IS NOT NULL THEN
        SELECT * INTO r FROM "public"."vt_records" WHERE key = p_previous;
        IF r.key IS NOT NULL AND r.fingerprint = p_previous_fingerprint
                AND (r.expires_at IS NULL OR r.expires_at > v_now) THEN
            o_which := 1;
            v_key := p_previous;
            v_fingerprint := p_previous_fingerprint;
        END IF;
    END IF;
    IF o_which = 0 THEN
        SELECT * INTO r FROM "public"."vt_records" WHERE key = p_key;
    END IF;
    -- Read without a lock first: a replay, a key in flight or another
    -- payload writes nothing. A write locks the row and decides again.
    FOR i IN 1..8 LOOP
        IF o_which = 1 AND (r.key IS NULL OR r.fingerprint <> v_fingerprint
                OR r.expires_at <= v_now) THEN
            -- The previous bucket's record went away meanwhile.
            o_which := 0;
            v_key := p_key;
            v_fingerprint := p_fingerprint;
            v_locked := false;
            SELECT * INTO r FROM "public"."vt_records" WHERE key = p_key;
            CONTINUE;
        END IF;
        IF r.key IS NULL THEN
            o_fence := nextval('"public"."vt_fence"');
            INSERT INTO "public"."vt_records"
                (key, fingerprint, state, fence, lease_end, attempts, after_ok, settle_at)
            VALUES (p_key, p_fingerprint, 'held', o_fence,
                    v_now + p_lease_us * interval '1 microsecond', p_attempts, p_after_ok,
                    CASE WHEN p_settle_us >= 0
                         THEN v_now + p_settle_us * interval '1 microsecond' END)
            ON CONFLICT (key) DO NOTHING;
            IF FOUND THEN
                o_kind := 1;
                RETURN;
            END IF;
            -- A concurrent claim inserted the key first: read it, locked.
            SELECT * INTO r FROM "public"."vt_records" WHERE key = p_key FOR UPDATE;
            v_now := clock_timestamp();
            v_locked := true;
            CONTINUE;
        END IF;
        IF NOT v_locked AND (r.expires_at <= v_now OR r.state <> 'completed'
                AND r.fingerprint = v_fingerprint
                AND NOT (r.state = 'held' AND r.lease_end > v_now)) THEN
            SELECT * INTO r FROM "public"."vt_records" WHERE key = v_key FOR UPDATE;
            -- The lock may have been waited for: decide on the time now.
            v_now := clock_timestamp();
            v_locked := true;
            CONTINUE;
        END IF;
        IF r.expires_at <= v_now THEN
            -- Expired: absent. A new logical call replaces it.
            o_fence := nextval('"public"."vt_fence"');
            UPDATE "public"."vt_records"
            SET fingerprint = p_fingerprint, state = 'held', fence = o_fence,
                lease_end = v_now + p_lease_us * interval '1 microsecond',
                attempts = p_attempts, after_ok = p_after_ok,
                settle_at = CASE WHEN p_settle_us >= 0
                                 THEN v_now + p_settle_us * interval '1 microsecond' END,
                value = NULL, expires_at = NULL
            WHERE key = p_key;
            o_kind := 1;
            RETURN;
        END IF;
        IF r.fingerprint <> v_fingerprint THEN
            o_kind := 5;
        ELSIF r.state = 'completed' THEN
            o_kind := 3;
            o_value := r.value;
        ELSIF r.state = 'held' AND r.lease_end > v_now THEN
            o_kind := 4;
            o_left_us := (extract(epoch FROM r.lease_end - v_now) * 1000000)::bigint;
        ELSE
            -- In doubt, settled, or held past its lease: taken over, and
            -- the taker verifies first.
            o_fence := nextval('"public"."vt_fence"');
            UPDATE "public"."vt_records"
            SET state = 'held', fence = o_fence,
                lease_end = v_now + p_lease_us * interval '1 microsecond', expires_at = NULL
            WHERE key = v_key;
            o_kind := 2;
            o_attempts := r.attempts;
            o_after_ok := r.after_ok;
            o_left_us := CASE WHEN r.settle_at IS NULL THEN -1
                ELSE greatest(0, (extract(epoch FROM r.settle_at - v_now) * 1000000)::bigint)
                END;
        END IF;
        RETURN;
    END LOOP;
    RAISE EXCEPTION 'the record of a key kept changing under its claim'
        USING ERRCODE = 'serialization_failure';
END
$$;

-- The holder's write-through before an attempt: false when p_fence no
-- longer holds the key.
CREATE OR REPLACE FUNCTION "public"."vt_dispatching"(
    p_key bytea, p_fence bigint, p_attempts bigint, p_after_ok boolean, p_settle_us bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE "public"."vt_records"
    SET attempts = p_attempts, after_ok = p_after_ok,
        settle_at = CASE WHEN p_settle_us >= 0
                         THEN clock_timestamp() + p_settle_us * interval '1 microsecond' END
    WHERE key = p_key AND state = 'held' AND fence = p_fence;
    RETURN FOUND;
END
$$;

-- Deletes up to p_limit expired records (NULL: all), the oldest first,
-- skipping any a claim has locked; answers how many.
CREATE OR REPLACE FUNCTION "public"."vt_purge"(p_limit integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    -- A variable, not clock_timestamp() itself: a volatile function is no
    -- index condition, and the scan would read every finished record.
    v_now timestamptz := clock_timestamp();
    v_purged bigint;
BEGIN
    DELETE FROM "public"."vt_records"
    WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM "public"."vt_records"
        WHERE expires_at <= v_now
        ORDER BY expires_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS v_purged = ROW_COUNT;
    RETURN v_purged;
END
$$;

-- Ends the hold of p_fence: p_state is 'completed' (with p_value, NULL: not
-- recorded), 'settled' (both expire after p_ttl_us) or 'in_doubt' (never
-- expires). Then deletes up to p_purge expired records. False when p_fence
-- no longer holds the key (nothing is written).
CREATE OR REPLACE FUNCTION "public"."vt_finish"(
    p_key bytea, p_fence bigint, p_state text, p_value bytea, p_ttl_us bigint,
    p_purge integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE "public"."vt_records"
    SET state = p_state, value = p_value, lease_end = NULL,
        expires_at = CASE WHEN p_state <> 'in_doubt'
                          THEN clock_timestamp() + p_ttl_us * interval '1 microsecond' END
    WHERE key = p_key AND state = 'held' AND fence = p_fence;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_purge > 0 THEN
        PERFORM "public"."vt_purge"(p_purge);
    END IF;
    RETURN true;
END
$$;

-- The holder's call was dropped: the record is left in doubt at once.
CREATE OR REPLACE FUNCTION "public"."vt_abandon"(p_key bytea, p_fence bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE "public"."vt_records" SET state = 'in_doubt', lease_end = NULL
    WHERE key = p_key AND state = 'held' AND fence = p_fence;
    RETURN FOUND;
END
$$;

-- A record as an operator sees it (a hold past its lease is in doubt), or
-- a row of NULLs. o_settle_us: settles in, -1 never.
CREATE OR REPLACE FUNCTION "public"."vt_record"(
    p_key bytea, OUT o_state text, OUT o_attempts bigint, OUT o_after_ok boolean,
    OUT o_settle_us bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    SELECT CASE WHEN state = 'held' AND lease_end <= v_now THEN 'in_doubt' ELSE state END,
           attempts, after_ok,
           CASE WHEN settle_at IS NULL THEN -1
                ELSE greatest(0, (extract(epoch FROM settle_at - v_now) * 1000000)::bigint) END
    INTO o_state, o_attempts, o_after_ok, o_settle_us
    FROM "public"."vt_records"
    WHERE key = p_key AND (expires_at IS NULL OR expires_at > v_now);
END
$$;

-- Up to p_limit records in doubt (held past their lease included).
CREATE OR REPLACE FUNCTION "public"."vt_in_doubt"(p_limit integer)
RETURNS TABLE (o_key bytea, o_attempts bigint, o_after_ok boolean, o_settle_us bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    SELECT key, attempts, after_ok,
           CASE WHEN settle_at IS NULL THEN -1::bigint
                ELSE greatest(0, (extract(epoch FROM settle_at - v_now) * 1000000)::bigint) END
    FROM "public"."vt_records"
    WHERE expires_at IS NULL AND (state = 'in_doubt' OR state = 'held' AND lease_end <= v_now)
    LIMIT p_limit;
END
$$;

-- A person's decision about the call in doubt under p_key: answers the state
-- the record was in (NULL: none), and changes it only if that was in doubt:
-- applied, it is completed without a value; not applied, it is settled now
-- with its attempts cleared. Either way under a new fence, so that a holder
-- presumed dead is fenced, and expiring after p_ttl_us.
CREATE OR REPLACE FUNCTION "public"."vt_resolve"(
    p_key bytea, p_applied boolean, p_ttl_us bigint)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
    r "public"."vt_records"%ROWTYPE;
BEGIN
    SELECT * INTO r FROM "public"."vt_records" WHERE key = p_key FOR UPDATE;
    v_now := clock_timestamp();
    IF r.key IS NULL OR r.expires_at <= v_now THEN
        RETURN NULL;
    END IF;
    IF r.state = 'held' AND r.lease_end > v_now OR r.state IN ('settled', 'completed') THEN
        RETURN r.state;
    END IF;
    IF p_applied THEN
        UPDATE "public"."vt_records"
        SET state = 'completed', fence = nextval('"public"."vt_fence"'), lease_end = NULL,
            value = NULL, expires_at = v_now + p_ttl_us * interval '1 microsecond'
        WHERE key = p_key;
    ELSE
        UPDATE "public"."vt_records"
        SET state = 'settled', fence = nextval('"public"."vt_fence"'), lease_end = NULL,
            attempts = 0, after_ok = false, settle_at = v_now, value = NULL,
            expires_at = v_now + p_ttl_us * interval '1 microsecond'
        WHERE key = p_key;
    END IF;
    RETURN 'in_doubt';
END
$$;

-- Transactional tools (PostgresLedger::transact): the opening and the
-- completion of an attempt, each run inside the attempt's own transaction,
-- so that the record commits with the tool's rows or not at all. Version 2
-- added them; running this script again upgrades version 1 in place.
--
-- The opening takes the key's advisory locks (p_lock, and p_previous_lock
-- first: calls take them in time order), held until the transaction ends:
-- a second call with the key, and the verifier, wait for the first. Then it
-- reads the record (each statement sees what committed before it began).
-- o_kind: 1 free (no record, or none this call's effect committed with:
-- expired, in doubt, settled, held past its lease), 3 completed, 4 held by a
-- live call outside a transaction, 5 another payload; o_which 0 for p_key,
-- 1 for p_previous.
CREATE OR REPLACE FUNCTION "public"."vt_tx_open"(
    p_key bytea, p_fingerprint bytea, p_previous bytea, p_previous_fingerprint bytea,
    p_lock bigint, p_previous_lock bigint, OUT o_kind integer, OUT o_which integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
    v_fingerprint bytea := p_fingerprint;
    r "public"."vt_records"%ROWTYPE;
BEGIN
    IF p_previous_lock IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(p_previous_lock);
    END IF;
    PERFORM pg_advisory_xact_lock(p_lock);
    v_now := clock_timestamp();
    o_which := 0;
    IF p_previous IS NOT NULL THEN
        SELECT * INTO r FROM "public"."vt_records" WHERE key = p_previous;
        IF r.key IS NOT NULL AND r.fingerprint = p_previous_fingerprint
                AND (r.expires_at IS NULL OR r.expires_at > v_now) THEN
            o_which := 1;
            v_fingerprint := p_previous_fingerprint;
        END IF;
    END IF;
    IF o_which = 0 THEN
        SELECT * INTO r FROM "public"."vt_records" WHERE key = p_key;
    END IF;
    IF r.key IS NULL OR r.expires_at <= v_now THEN
        o_kind := 1;
    ELSIF r.fingerprint <> v_fingerprint THEN
        o_kind := 5;
    ELSIF r.state = 'completed' THEN
        o_kind := 3;
    ELSIF r.state = 'held' AND r.lease_end > v_now THEN
        o_kind := 4;
    ELSE
        o_kind := 1;
    END IF;
END
$$;

-- The completion: the record completed with the value, as the last
-- statement of the transaction the opening began (which holds the key's
-- locks). A record completed meanwhile (it cannot be while the locks hold:
-- a guard, not a path) fails the transaction, and nothing commits.
CREATE OR REPLACE FUNCTION "public"."vt_tx_complete"(
    p_key bytea, p_fingerprint bytea, p_attempts bigint, p_value bytea, p_ttl_us bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO "public"."vt_records" AS r
        (key, fingerprint, state, fence, lease_end, attempts, after_ok, settle_at, value,
         expires_at)
    VALUES (p_key, p_fingerprint, 'completed', nextval('"public"."vt_fence"'), NULL,
            p_attempts, false, v_now, p_value, v_now + p_ttl_us * interval '1 microsecond')
    ON CONFLICT (key) DO UPDATE
    SET fingerprint = excluded.fingerprint, state = 'completed', fence = excluded.fence,
        lease_end = NULL, attempts = excluded.attempts, after_ok = false,
        settle_at = excluded.settle_at, value = excluded.value, expires_at = excluded.expires_at
    WHERE r.state <> 'completed' OR r.expires_at <= v_now;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the record of the key was completed by another transaction'
            USING ERRCODE = 'serialization_failure';
    END IF;
END
$$;

-- Last: the schema's version, NULL when its table or sequence is gone
-- (the ledger then creates them again, if it may).
CREATE OR REPLACE FUNCTION "public"."vt_schema_version"()
RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT 2 WHERE to_regclass('"public"."vt_records"') IS NOT NULL
        AND to_regclass('"public"."vt_fence"') IS NOT NULL
$$;
