//! The Lua scripts of the Redis ledger, one per operation, and how the
//! ledger names them. Each runs atomically in Redis, in one round trip
//! (`EVALSHA`).

use std::sync::LazyLock;

use redis::Script;

/// Claims a key (or the previous bucket's key), in one step.
///
/// KEYS: the fence counter, the record [, the previous bucket's record].
/// ARGV: fingerprint, previous fingerprint, lease (µs), the first attempt's
/// attempts, after-OK flag and settle time (µs from now, -1: never), the
/// claim's token as a fresh hold records it (`f` and the token), and as a
/// hold taken over records it (`r` and the token).
///
/// Replies `{kind, which, ...}`: `which` 0 for the key, 1 for the previous
/// one; kind 1 fresh `{fence}`, 2 resume `{fence, attempts, after_ok, settle
/// left (µs, -1: never)}`, 3 completed `{has value, value}`, 4 in flight
/// `{lease left (µs)}`, 5 mismatch.
///
/// The token makes the claim safe to send again when its answer was lost: a
/// hold taken with it is answered again as it was taken (`c` says how: `f`
/// fresh, `r` resumed), its lease renewed, and nothing else written. A hold
/// of this token that has ended since (its holder finished, which it could
/// only do after it got the answer) is an echo nobody waits for: answered in
/// flight for 0 µs, so that a caller still there claims anew.
///
/// What it costs is Redis's CPU, and Redis runs one script at a time: a
/// fresh claim, the hot path, runs four commands (`HMGET`, `TIME`, `INCR`,
/// `HSET`) in straight-line code, without closures, tables built field by
/// field or `unpack`; the value (`v`) is read only when the call completed;
/// the tokens come ready-made, compared without building strings. The
/// after-OK flag (`o`) is always written, and read as unset when absent:
/// a process still running the previous claim script (a rolling upgrade)
/// needs it to take such a record over.
/// Every number written is formatted as an integer by `%d` (a 64-bit `long`:
/// exact below 2^53, and durations are capped well below), never left to
/// Redis: Redis 7.2+ writes a double such as 1e8 as `1e+08`, which would
/// break the fence comparisons and the operator's reading of `l` and `t`.
/// (`%.0f` goes through glibc's multi-precision float printing, a visible
/// share of the claim in a profile of Redis.)
pub(super) const CLAIM: &str = r"
local key, fp, which = KEYS[2], ARGV[1], 0
if KEYS[3] and redis.call('HGET', KEYS[3], 'f') == ARGV[2] then
  key, fp, which = KEYS[3], ARGV[2], 1
end
local r = redis.call('HMGET', key, 'f', 's', 'c', 'l', 'n', 'a', 'o', 't')
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
if not r[1] then
  local fence = redis.call('INCR', KEYS[1])
  local settle = tonumber(ARGV[6])
  local n, l = string.format('%d', fence), string.format('%d', now + ARGV[3])
  if settle < 0 then
    redis.call('HSET', key, 'f', fp, 's', 'h', 'n', n, 'l', l, 'a', ARGV[4], 'o', ARGV[5],
      'c', ARGV[7])
  else
    redis.call('HSET', key, 'f', fp, 's', 'h', 'n', n, 'l', l, 'a', ARGV[4], 'o', ARGV[5],
      'c', ARGV[7], 't', string.format('%d', now + settle))
  end
  return {1, which, fence}
end
if r[1] ~= fp then return {5, which} end
local state = r[2]
if state == 'c' then
  local v = redis.call('HGET', key, 'v')
  if v then return {3, which, 1, v} end
  return {3, which, 0}
end
local settle, after_ok = -1, 0
if r[8] then settle = math.max(0, r[8] - now) end
if r[7] == '1' then after_ok = 1 end
if r[3] == ARGV[7] or r[3] == ARGV[8] then
  if state ~= 'h' then return {4, which, 0} end
  redis.call('HSET', key, 'l', string.format('%d', now + ARGV[3]))
  local fence = tonumber(r[5])
  if r[3] == ARGV[7] then return {1, which, fence} end
  return {2, which, fence, tonumber(r[6]), after_ok, settle}
end
if state == 'h' then
  local left = r[4] - now
  if left > 0 then return {4, which, left} end
end
-- In doubt, settled, or held past its lease: taken over, to verify first.
local fence = redis.call('INCR', KEYS[1])
redis.call('HSET', key, 's', 'h', 'n', string.format('%d', fence),
  'l', string.format('%d', now + ARGV[3]), 'c', ARGV[8])
redis.call('PERSIST', key)
return {2, which, fence, tonumber(r[6]), after_ok, settle}
";

/// Records the holder's progress. KEYS: the record. ARGV: fence, attempts,
/// after-OK flag, settle time (µs from now, -1: never), the write's token.
/// Replies 1, or 0 when the fence does not hold the key.
///
/// Sent again after a lost answer it writes the same (the settle time from
/// a later now: later, never earlier). The token (`q`) lets [`WITHDRAW`]
/// take back this announcement, and only this one.
pub(super) const DISPATCHING: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 'n')
if r[1] ~= 'h' or r[2] ~= ARGV[1] then return 0 end
local settle = tonumber(ARGV[4])
if settle >= 0 then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'a', ARGV[2], 'o', ARGV[3], 'q', ARGV[5],
    't', string.format('%d', t[1] * 1000000 + t[2] + settle))
else
  redis.call('HSET', KEYS[1], 'a', ARGV[2], 'o', ARGV[3], 'q', ARGV[5])
  redis.call('HDEL', KEYS[1], 't')
end
return 1
";

/// Ends a hold. KEYS: the record. ARGV: fence, end (`c`, `s` or `d`), TTL
/// (ms) [, the value]. Replies 1, or 0 when the fence does not hold the key.
///
/// `e` keeps the fence whose finish landed: sent again after a lost answer,
/// the finish is answered done, even if another call took the key over in
/// between (it took over what this finish wrote).
pub(super) const FINISH: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 'n', 'e')
if r[1] ~= 'h' or r[2] ~= ARGV[1] then
  if r[3] == ARGV[1] then return 1 end
  return 0
end
if ARGV[2] == 'c' and ARGV[4] then
  redis.call('HSET', KEYS[1], 's', 'c', 'e', ARGV[1], 'v', ARGV[4])
else
  redis.call('HSET', KEYS[1], 's', ARGV[2], 'e', ARGV[1])
end
if ARGV[2] ~= 'd' then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 1
";

/// Leaves a hold in doubt. KEYS: the record. ARGV: fence. Replies 1, or 0
/// when the fence does not hold the key.
pub(super) const ABANDON: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 'n')
if r[1] ~= 'h' or r[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 's', 'd')
return 1
";

/// Undoes a claim whose caller never learnt it held the key (its answer was
/// lost and its retries ran out, or its future was dropped): a fresh hold is
/// deleted (the key is as if never claimed: its first attempt never went
/// out), a hold taken over goes back in doubt, its progress as it was.
/// KEYS: the record [, the previous bucket's record]. ARGV: the claim's
/// token as a fresh hold records it, and as a hold taken over records it
/// (see [`CLAIM`]). Replies 1 when a hold was undone, else 0.
pub(super) const RELEASE: &str = r"
for _, key in ipairs(KEYS) do
  local r = redis.call('HMGET', key, 's', 'c')
  if r[1] == 'h' then
    if r[2] == ARGV[1] then
      redis.call('DEL', key)
      return 1
    end
    if r[2] == ARGV[2] then
      redis.call('HSET', key, 's', 'd')
      return 1
    end
  end
end
return 0
";

/// Takes back an attempt announced by a write-through whose answer never
/// reached its caller (so the caller did not dispatch it): only while the
/// record is still that hold's (its fence), still counts that attempt, and
/// that announcement is the last (its token). KEYS: the record. ARGV: fence,
/// attempt, the write's token. Replies 1 when taken back, else 0.
pub(super) const WITHDRAW: &str = r"
local r = redis.call('HMGET', KEYS[1], 'n', 'a', 'q')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] or r[3] ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'a', string.format('%d', tonumber(ARGV[2]) - 1))
redis.call('HDEL', KEYS[1], 'q')
return 1
";

/// Reads records for an operator, with the time. KEYS: the records. Replies
/// `{now (µs), then per record its s, l, a, o, t}` (each nil when absent).
pub(super) const READ: &str = r"
local t = redis.call('TIME')
local out = {tonumber(t[1]) * 1000000 + tonumber(t[2])}
for _, key in ipairs(KEYS) do
  local r = redis.call('HMGET', key, 's', 'l', 'a', 'o', 't')
  for i = 1, 5 do out[#out + 1] = r[i] end
end
return out
";

/// Whether a fence still holds a key, and for how long, on Redis's clock.
/// KEYS: the record. ARGV: fence. Replies the lease left (µs, > 0), or -1
/// when the fence does not hold the key (taken over, finished, abandoned,
/// resolved, or no record) or its lease has ended. Reads only.
///
/// `TIME` is read only once the fence is found holding: an answer for a
/// hold that ended costs one command.
pub(super) const HOLD: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 'n', 'l')
if r[1] ~= 'h' or r[2] ~= ARGV[1] then return -1 end
local t = redis.call('TIME')
local left = tonumber(r[3]) - (t[1] * 1000000 + t[2])
if left > 0 then return left end
return -1
";

/// Records a person's decision about a record in doubt. KEYS: the fence
/// counter, the record. ARGV: `c` (applied) or `s` (not applied), TTL (ms),
/// the decision's token. Replies the state before as its letter (`h` only
/// for a live hold: a hold past its lease is `d`, and resolved), or 0 when
/// there is no record. Only `d` changed anything. Sent again after a lost
/// answer (the record keeps the token, `r`), it answers `d` again.
pub(super) const RESOLVE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local r = redis.call('HMGET', KEYS[2], 's', 'l', 'r')
if not r[1] then return 0 end
if r[3] == ARGV[3] then return 'd' end
if r[1] == 'h' and tonumber(r[2]) > now then return 'h' end
if r[1] ~= 'h' and r[1] ~= 'd' then return r[1] end
local fence = string.format('%d', redis.call('INCR', KEYS[1]))
if ARGV[1] == 'c' then
  redis.call('HSET', KEYS[2], 's', 'c', 'n', fence, 'r', ARGV[3])
else
  redis.call('HSET', KEYS[2], 's', 's', 'n', fence, 'a', '0', 'o', '0',
    't', string.format('%d', now), 'r', ARGV[3])
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 'd'
";

pub(super) static SCRIPTS: LazyLock<[Script; 9]> = LazyLock::new(|| {
    [CLAIM, DISPATCHING, FINISH, ABANDON, READ, RESOLVE, RELEASE, WITHDRAW, HOLD].map(Script::new)
});

pub(super) fn script(which: usize) -> &'static Script {
    &SCRIPTS[which]
}

pub(super) const S_CLAIM: usize = 0;
pub(super) const S_DISPATCHING: usize = 1;
pub(super) const S_FINISH: usize = 2;
pub(super) const S_ABANDON: usize = 3;
pub(super) const S_READ: usize = 4;
pub(super) const S_RESOLVE: usize = 5;
pub(super) const S_RELEASE: usize = 6;
pub(super) const S_WITHDRAW: usize = 7;
pub(super) const S_HOLD: usize = 8;
