-- template_rules.lua: what Meta said of one template beyond its status (meta-cloud-api.md §4.5), and the pace
-- of its marketing while its quality is RED.
--
-- One hash per template scope, in the quarantine scopes' slot: bw:{qs}:rules:<scope_key>, fields
--   cat  Meta's category (template_category_update: MARKETING, UTILITY, AUTHENTICATION; '' unknown)
--   q    Meta's quality (message_template_quality_update: GREEN, YELLOW, RED, UNKNOWN)
--   rpm  sends per minute the template's marketing may take while q is RED (0: not slowed)
--   tat  the GCRA's theoretical arrival time (ms) of that pace, fleet-wide
--   line when the next refused send is told to come back (ms): refusals come back one interval apart, at most
--        LINE_HORIZON_MS ahead, instead of all at once for the same slot
-- The dispatcher applies marketing rules to a template Meta moved to MARKETING, and paces a RED template's
-- marketing at rpm with no burst: Meta pauses a template whose quality stays low (3 h, 6 h, then disabled),
-- so fewer sends until the rating recovers keep the next pause from coming (the safe reading of "slow").
--
-- KEYS[1]  the rules hash
-- ARGV[1]  mode: "category" (ARGV[2] the category), "quality" (ARGV[2] the quality, ARGV[3] rpm), "read", "take"
-- Returns: { category, quality, rpm, retry_ms } (retry_ms: take only, 0 when the send may go now).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1]
local mode = ARGV[1]

local function state(retry)
  local h = redis.call('HMGET', key, 'cat', 'q', 'rpm')
  return { h[1] or '', h[2] or '', tonumber(h[3]) or 0, retry }
end

if mode == 'read' then
  return state(0)
elseif mode == 'category' then
  redis.call('HSET', key, 'cat', ARGV[2] or '')
  return state(0)
elseif mode == 'quality' then
  local rpm = math.max(0, math.floor(tonumber(ARGV[3]) or 0))
  redis.call('HSET', key, 'q', ARGV[2] or '', 'rpm', rpm)
  if ARGV[2] ~= 'RED' then redis.call('HDEL', key, 'tat', 'line') end
  return state(0)
elseif mode == 'take' then
  local LINE_HORIZON_MS = 600000
  local h = redis.call('HMGET', key, 'q', 'rpm', 'tat', 'line')
  local rpm = tonumber(h[2]) or 0
  if h[1] ~= 'RED' or rpm <= 0 then return state(0) end
  local interval = 60000 / rpm
  local tat = math.max(tonumber(h[3]) or 0, now)
  if tat > now then
    local back = math.min(math.max(tonumber(h[4]) or 0, tat), now + LINE_HORIZON_MS)
    redis.call('HSET', key, 'line', math.floor(back + interval))
    return state(math.ceil(back - now))
  end
  redis.call('HSET', key, 'tat', math.floor(tat + interval))
  return state(0)
end
return redis.error_reply('bad mode')
