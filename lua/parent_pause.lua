-- parent_pause.lua: the pause of a scope above the sender (app, WABA) or the halt of an access token.
--
-- Such a pause covers every number of the app / WABA / token, so it cannot live in a number's state hash (a
-- script may only touch keys of one hash slot on Redis Cluster). Each parent has its own key with its own hash
-- tag, and the breaker client reads it before admitting (cached for parent_refresh_ms, updated at once by the
-- process that records the pause):
--   bw:{app:<app_id>}:pause       4, 17, 32, 613: the app's call budget; pause every number on the app
--   bw:{waba:<waba_id>}:pause     80007 / 80008: the WABA's budget; pause every number of the WABA
--   bw:{tok:<sha256 of the token, first 16 hex>}:halt
--                                 0, 190 and the other credentials codes: halt every number on the token until an
--                                 operator clears it or the token changes (a new token has another key; the old
--                                 key expires after halt_ttl_ms). The token itself never reaches Redis.
-- Fields: PF in scope_prelude.lua. Pauses never shorten: a pause only extends the time already there.
--
-- KEYS[1]  the parent key
-- ARGV[1]  mode: "read", "pause", "halt" or "clear"
-- ARGV[2]  pause: pause ms; halt: ttl of the halt key ms
-- ARGV[3]  reason (pause, halt)
-- Returns: { now_ms, paused_until_ms (0 none), reason, halted (1 / 0) }  (error "bad mode" for an unknown mode)

local now = now_ms()
local key = KEYS[1]
local mode = ARGV[1]
if mode == 'pause' then
  local until_ms = now + math.max(1, num(ARGV[2]))
  if until_ms > num(redis.call('HGET', key, PF.paused_until)) then
    redis.call('HSET', key, PF.paused_until, until_ms, PF.reason, ARGV[3] or '')
    if redis.call('HGET', key, PF.halted) ~= '1' then redis.call('PEXPIRE', key, until_ms - now) end
  end
elseif mode == 'halt' then
  redis.call('HSET', key, PF.halted, 1, PF.reason, ARGV[3] or '')
  redis.call('PEXPIRE', key, math.max(1, num(ARGV[2])))
elseif mode == 'clear' then
  redis.call('DEL', key)
elseif mode ~= 'read' then
  return redis.error_reply('bad mode')
end
local h = redis.call('HMGET', key, PF.paused_until, PF.reason, PF.halted)
local pu = num(h[1])
if pu <= now then pu = 0 end
return { now, pu, h[2] or '', num(h[3]) }
