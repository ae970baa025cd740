-- recipient_marketing.lua: a recipient's marketing state within one tenant, across every sender of it.
--
--   bw:{mkt:<tenant>}:r:<recipient_key>   fields: d (deferred until, ms), dc (its code), s (suppressed: code),
--                                          sa (suppressed at, ms)
-- recipient_key is bw_common::mask::recipient_key (a hash of the digits): no phone number ever reaches Redis.
--
-- 131049 (per-user marketing limit) defers marketing to the recipient from ANY sender of the tenant for at least
-- 24 h; the reference says a retry inside the period extends Meta's block, so nothing is sent before it ends. A
-- deferral never shortens. 131050 (the user stopped marketing) and 130472 (Meta's marketing experiment) are final
-- for marketing to the user: a suppression, kept `ARGV[3]` ms (refreshed by each new suppression), after which a
-- send may try again and Meta's answer records it anew. A `user_preferences` `stop` webhook suppresses as 131050
-- does; its `resume` lifts a suppression of that code only (130472 is Meta's experiment, not the user's choice,
-- and a 131049 deferral runs to its end).
--
-- KEYS[1]  the recipient's key
-- ARGV[1]  mode: "read", "defer", "suppress" or "resume"
-- ARGV[2]  defer / suppress: Meta code; resume: the suppression code it lifts
-- ARGV[3]  defer: the deferral ms; suppress: how long the suppression is kept ms
-- Returns: { deferred_until_ms (0: none), deferral code, suppression code (0: none), now_ms }
--          (error "bad mode" for an unknown mode)

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1]
local mode = ARGV[1]

local function state()
  local h = redis.call('HMGET', key, 'd', 'dc', 's')
  local d = tonumber(h[1]) or 0
  local dc = tonumber(h[2]) or 0
  if d <= now then d, dc = 0, 0 end
  return { d, dc, tonumber(h[3]) or 0, now }
end

local function keep_for(ms)
  local ttl = redis.call('PTTL', key)
  if ttl < ms then redis.call('PEXPIRE', key, ms) end
end

if mode == 'read' then
  return state()
elseif mode == 'defer' then
  local ms = math.max(1, tonumber(ARGV[3]) or 0)
  local untl = now + ms
  local old = tonumber(redis.call('HGET', key, 'd')) or 0
  if old > untl then untl = old end
  redis.call('HSET', key, 'd', untl, 'dc', tonumber(ARGV[2]) or 0)
  keep_for(untl - now)
  return state()
elseif mode == 'suppress' then
  local ms = math.max(1, tonumber(ARGV[3]) or 0)
  redis.call('HSET', key, 's', tonumber(ARGV[2]) or 0, 'sa', now)
  keep_for(ms)
  return state()
elseif mode == 'resume' then
  if (tonumber(redis.call('HGET', key, 's')) or 0) == (tonumber(ARGV[2]) or 0) then
    redis.call('HDEL', key, 's', 'sa')
  end
  return state()
end
return redis.error_reply('bad mode')
