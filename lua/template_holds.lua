-- template_holds.lua: the hold of one quarantine scope (a template, or an unclassified code).
--
-- While a scope is held, the dispatcher puts every message of it into BW_QUARANTINE unsent (reason
-- template_held, the entry's scope_key names the scope); other templates flow. The hold is one hash per scope:
--   bw:{qs}:hold:<scope_key>   fields: c (Meta code), s (since, ms), u (until, ms; 0 = until released), n (holds)
-- The scope key names a template (WABA, language, name) or a code, never a phone number.
-- 132015 (paused for low quality) holds for its default pause, 3 h, then lapses by itself; 132001, 132007, 132016
-- hold until released (an operator's `bwctl quarantine release`, or the template's status webhook).
-- A hold never shortens: a timed hold extends to the later end, and an untimed one stays untimed.
--
-- KEYS[1]  the hold key
-- ARGV[1]  mode: "hold", "read" or "release"
-- ARGV[2]  hold: Meta code
-- ARGV[3]  hold: length ms (0: until released)
-- Returns: { held (1 / 0), code, since_ms, until_ms (0: until released), remaining_ms (-1: until released) }
--          release returns what was there before it went. Error "bad mode" for an unknown mode.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1]
local mode = ARGV[1]

local function state()
  local h = redis.call('HMGET', key, 'c', 's', 'u')
  if not h[1] then return { 0, 0, 0, 0, 0 } end
  local untl = tonumber(h[3]) or 0
  if untl > 0 and untl <= now then return { 0, 0, 0, 0, 0 } end
  local remaining = -1
  if untl > 0 then remaining = untl - now end
  return { 1, tonumber(h[1]) or 0, tonumber(h[2]) or 0, untl, remaining }
end

if mode == 'read' then
  return state()
elseif mode == 'release' then
  local before = state()
  redis.call('DEL', key)
  return before
elseif mode == 'hold' then
  local code = tonumber(ARGV[2]) or 0
  local ms = tonumber(ARGV[3]) or 0
  local before = state()
  local since = now
  if before[1] == 1 then since = before[3] end
  local untl = 0
  if ms > 0 then
    untl = now + ms
    if before[1] == 1 and (before[4] == 0 or before[4] > untl) then untl = before[4] end
  end
  redis.call('HSET', key, 'c', code, 's', since, 'u', untl)
  redis.call('HINCRBY', key, 'n', 1)
  if untl > 0 then
    redis.call('PEXPIREAT', key, untl)
  else
    redis.call('PERSIST', key)
  end
  return state()
end
return redis.error_reply('bad mode')
