-- throughput_set.lua: Meta's stated throughput of one number, as its webhook gave it (phone_number_quality_update
-- THROUGHPUT_UPGRADE: 1,000 mps; meta-cloud-api.md §3.1, §4.5). One hash per number in the number's hash slot,
-- so admit_send.lua reads it in the admission call and every dispatcher sends at the rate it implies
-- (throughput_rate in scope_prelude.lua: the limit times throughput_margin, never above it). It never expires:
-- Meta announces an upgrade once. "clear" forgets the limit (config's throughput_mps, or rate_per_s, applies
-- again); the inbound count stays.
--
-- KEYS[1]  the throughput hash (bw:{<waba>:<phone>}:tput)
-- ARGV[1]  mode: "set", "read" or "clear"
-- ARGV[2]  set: messages per second Meta states (positive)
-- ARGV[3]  set: the webhook event (THROUGHPUT_UPGRADE)
-- Returns: { mps (0: none recorded), at_ms, event, inbound total }. Error "bad mode" / "bad mps".

local key = KEYS[1]
local mode = ARGV[1]
local function state()
  local h = redis.call('HMGET', key, TP.mps, TP.at, TP.event, TP.inbound)
  return { math.floor(num(h[1])), math.floor(num(h[2])), h[3] or '', math.floor(num(h[4])) }
end
if mode == 'read' then
  return state()
elseif mode == 'clear' then
  redis.call('HDEL', key, TP.mps, TP.at, TP.event)
  return state()
elseif mode == 'set' then
  local mps = tonumber(ARGV[2])
  if mps == nil or mps <= 0 then return redis.error_reply('bad mps') end
  redis.call('HSET', key, TP.mps, math.floor(mps), TP.at, now_ms(), TP.event, ARGV[3] or '')
  return state()
end
return redis.error_reply('bad mode')
