-- order_register.lua: registers an accepted operation in its recipient's order set (called by ingest before the
-- request is stored in BW_SEND, only for categories that keep order).
--
-- The order set of a (sender, recipient) pair is a sorted set bw:{<waba>:<phone>}:ord:<recipient_key> (the
-- sender's hash tag, so admit_send.lua reads it in the same slot as the sender's limits; the recipient appears
-- only as its masked key). Member: operation id; score: Redis time of the registration in microseconds, never
-- below the set's highest score + 1, so the scores follow the order in which ingest accepted the operations
-- (one clock for the whole fleet: the slot's Redis) even within a microsecond or after a clock step back. A
-- member leaves the set when the operation reached Meta or ended for good (record_outcomes.lua,
-- order_release.lua, or the dispatcher's ledger check of a blocking member); until then admit_send.lua refuses
-- every later member with order_wait.
--
-- Why this cannot deadlock: the waits-for relation is the score order within one set (a member waits only for
-- members with lower scores, never for another set), so the lowest member is never refused by the gate and
-- moves on like any message; every way out of the set removes it. A member whose release was lost (a crash
-- between this registration and the publish, a dispatcher killed after Meta accepted) is removed by the first
-- dispatcher it blocks once the ledger shows it ended or never arrived (after a grace), and an idle set expires
-- after ARGV[2] ms. Any number of ingest, dispatcher and replay instances share the one set per pair.
--
-- KEYS[1]  order set
-- ARGV[1]  operation id
-- ARGV[2]  time to live of the set, ms (refreshed on every registration)
-- Returns: { 1 when added (0 when already a member: a producer's retry keeps its first place), score_us }

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local have = redis.call('ZSCORE', KEYS[1], ARGV[1])
if have then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return { 0, have }
end
local score = now_us
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] ~= nil and tonumber(last[2]) >= score then score = tonumber(last[2]) + 1 end
local s = string.format('%.0f', score)
redis.call('ZADD', KEYS[1], s, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return { 1, s }
