-- portfolio_budget.lua: a business portfolio's messaging-limit budget (meta-cloud-api.md §3.3): the unique users
-- it reached with business-initiated messages outside a customer service window in a rolling 24 h.
--
--   bw:{pf:<portfolio>}:budget       sorted set: member recipient_key, score the last counted send (ms)
--   bw:{pf:<portfolio>}:budget:cfg   hash: limit (-1 unlimited), raw (Meta's value), source, set_at (ms),
--                                    held_at (ms of the last hold), held_class (0 marketing, 1 reserved)
-- recipient_key is bw_common::mask::recipient_key (a hash of the digits): no phone number ever reaches Redis.
-- Both keys share the hash tag {pf:<portfolio>}, so the script runs on Redis Cluster.
--
-- Exact count: a recipient stays in the set until `window_ms` after its LAST counted send, so the set holds every
-- user with a counted send in the last window (a first-send score would let a user reached again drop out while
-- Meta still counts it). Each call prunes what left the window (amortised O(log n)). A recipient already in the
-- set is not new: it passes at any fill, and its score moves to now. A new recipient is counted only under the
-- cap of its class: the whole limit for reserved classes (authentication, utility), the limit less the reserve
-- for marketing, so marketing is held first. The effective limit is the stored one (Meta's webhook, or an
-- operator's `set`), else ARGV's fallback (config; the compiled default is the lowest tier, the safe reading).
-- Unlimited (-1): nothing is counted or kept.
--
-- KEYS[1]  the budget set; KEYS[2] the budget's hash
-- ARGV[1]  mode: "admit_many", "set" or "read"
-- admit_many: ARGV[2] window_ms, ARGV[3] fallback limit (-1 unlimited), ARGV[4] reserve (per mille of the limit
--         kept for reserved classes), then three values per message: recipient_key, "1" reserved class, "1" when
--         the recipient's customer service window is open. The messages are admitted in order (one dispatcher's
--         messages of one portfolio in one round trip).
--   Returns per message { verdict, used, limit, wait_ms }, flattened: verdict 0 window open (not counted),
--   1 already counted (renewed), 2 newly counted, 3 unlimited (not counted), -1 held (wait_ms: until the oldest
--   entry leaves the window)
-- set:    ARGV[2] limit (-1 unlimited, > 0 a count), ARGV[3] source, ARGV[4] raw value, ARGV[5] "seed": only
--         when no limit is stored (a Graph read never overrides a webhook that came first)
--   Returns { previous limit (0: none stored), limit now }
-- read:   ARGV[2] window_ms, ARGV[3] fallback limit
--   Returns { used, limit, source ("" when the fallback), raw, set_at, oldest_ms (0: none), held_at, held_class,
--             now_ms }
-- Errors: "bad mode", "bad limit".

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local set, cfg = KEYS[1], KEYS[2]
local mode = ARGV[1]

local function effective(fallback)
  local stored = tonumber(redis.call('HGET', cfg, 'limit'))
  if stored then return stored, true end
  return tonumber(fallback) or 0, false
end

-- One business-initiated message to recipient `rk` (the set already pruned; `used` its count, `limit` the
-- effective limit): returns its verdict, the users counted after it, and wait_ms.
local function admit_one(rk, window, limit, used, reserve_pm, reserved, open)
  if open then
    return 0, redis.call('ZCOUNT', set, now - window + 1, '+inf'), 0
  end
  if limit < 0 then
    return 3, 0, 0
  end
  if redis.call('ZSCORE', set, rk) then
    redis.call('ZADD', set, now, rk)
    redis.call('PEXPIRE', set, window)
    return 1, used, 0
  end
  local cap = limit
  if not reserved then
    local reserve = math.min(1000, math.max(0, tonumber(reserve_pm) or 0))
    cap = math.floor(limit * (1000 - reserve) / 1000)
  end
  if used < cap then
    redis.call('ZADD', set, now, rk)
    redis.call('PEXPIRE', set, window)
    return 2, used + 1, 0
  end
  local oldest = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  local wait = window
  if oldest[2] then wait = math.max(1, tonumber(oldest[2]) + window - now) end
  redis.call('HSET', cfg, 'held_at', now, 'held_class', reserved and 1 or 0)
  return -1, used, wait
end

-- The set pruned of users who left the window, and how many remain (nothing to prune when unlimited).
local function prune(window, limit)
  if limit < 0 then return 0 end
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now - window)
  return redis.call('ZCARD', set)
end

if mode == 'admit_many' then
  local window = math.max(1, tonumber(ARGV[2]) or 86400000)
  local limit = effective(ARGV[3])
  local used = prune(window, limit)
  local out = {}
  for i = 5, #ARGV, 3 do
    local open = ARGV[i + 2] == '1'
    local verdict, used_now, wait = admit_one(ARGV[i], window, limit, used, ARGV[4], ARGV[i + 1] == '1', open)
    if not open then used = used_now end
    out[#out + 1] = verdict
    out[#out + 1] = used_now
    out[#out + 1] = limit
    out[#out + 1] = wait
  end
  return out
elseif mode == 'set' then
  local limit = tonumber(ARGV[2])
  if not limit or limit == 0 or limit < -1 or limit ~= math.floor(limit) then
    return redis.error_reply('bad limit')
  end
  local previous = tonumber(redis.call('HGET', cfg, 'limit')) or 0
  if ARGV[5] == 'seed' and previous ~= 0 then
    return { previous, previous }
  end
  redis.call('HSET', cfg, 'limit', limit, 'source', ARGV[3] or '', 'raw', ARGV[4] or '', 'set_at', now)
  return { previous, limit }
elseif mode == 'read' then
  local window = math.max(1, tonumber(ARGV[2]) or 86400000)
  local limit, stored = effective(ARGV[3])
  local h = redis.call('HMGET', cfg, 'source', 'raw', 'set_at', 'held_at', 'held_class')
  local oldest = redis.call('ZRANGEBYSCORE', set, now - window + 1, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  return {
    redis.call('ZCOUNT', set, now - window + 1, '+inf'),
    limit,
    stored and (h[1] or '') or '',
    stored and (h[2] or '') or '',
    tonumber(h[3]) or 0,
    tonumber(oldest[2]) or 0,
    tonumber(h[4]) or 0,
    tonumber(h[5]) or 0,
    now,
  }
end
return redis.error_reply('bad mode')
