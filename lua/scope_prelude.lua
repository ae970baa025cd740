-- scope_prelude.lua: shared functions of the scope scripts (breaker, window, limits).
--
-- This file is not a script on its own: bw-breaker prepends it to each `*_*.lua` script of this directory
-- (admit_send, record_outcomes, tick_scope, read_scope, force_breaker, observe_usage) before loading, so the
-- state machine is written once. It reads and writes nothing by itself.
--
-- Conventions shared by every script:
--   KEYS[1]  bw:{<waba>:<phone>}:cfg    hash of per-scope config written by the coordinator (may be missing)
--   KEYS[2]  bw:{<waba>:<phone>}:state  hash holding breaker state, sliding window, sender bucket, pause, usage
--   ARGV[1]  compiled defaults "name=value;name=value;..." overlaid by the cfg hash field by field
-- Clock: Redis server time (TIME), never the caller's.
--
-- State hash fields: st (1 CLOSED, 2 OPEN, 3 HALF_OPEN, 4 FORCED_OPEN, 5 FORCED_CLOSED), since, inc (incident
-- id), ou (open until ms), streak (trips in this incident), trips (total), hs (half-open successes),
-- cs/cc (canary second / count), rc (ramp start ms, 0 none), rl (consecutive rate limits), pu/pr (paused
-- until ms / reason), tk/tt (sender tokens / refill time ms), lo (slow-throttle GCRA TAT ms), us/ua (Meta
-- usage percent / when), wn<i>/wc<i>/wf<i> (window ring: bucket number, calls, failures of slot i).

local CLOSED, OPEN, HALF_OPEN, FORCED_OPEN, FORCED_CLOSED = 1, 2, 3, 4, 5

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function num(v, d)
  local n = tonumber(v)
  if n == nil then return d or 0 end
  return n
end

local function load_cfg(defaults, cfg_key)
  local c = {}
  for k, v in string.gmatch(defaults, '([%w_]+)=([^;]*)') do c[k] = tonumber(v) end
  local h = redis.call('HGETALL', cfg_key)
  for i = 1, #h, 2 do
    local n = tonumber(h[i + 1])
    if n ~= nil then c[h[i]] = n end
  end
  c.window_buckets = math.max(1, math.min(60, math.floor(num(c.window_buckets, 10))))
  c.window_ms = math.max(c.window_buckets, num(c.window_ms, 10000))
  return c
end

-- The state table keeps loaded values in S and changed fields in S.__dirty.
local function load_state(key)
  local h = redis.call('HGETALL', key)
  local s = { __dirty = {} }
  for i = 1, #h, 2 do s[h[i]] = h[i + 1] end
  return s
end

local function set(S, k, v)
  S[k] = v
  S.__dirty[k] = true
end

local function save_state(S, key)
  local flat = {}
  for k, _ in pairs(S.__dirty) do
    flat[#flat + 1] = k
    flat[#flat + 1] = tostring(S[k])
  end
  if #flat > 0 then redis.call('HSET', key, unpack(flat)) end
end

local function fmt(x)
  return string.format('%.6f', x)
end

-- Sliding window of window_buckets sub-buckets of window_ms / window_buckets each.
local function bucket_ms(c)
  return math.max(1, math.floor(c.window_ms / c.window_buckets))
end

local function window_add(S, c, now, calls, fails)
  local n = math.floor(now / bucket_ms(c))
  local i = n % c.window_buckets
  if num(S['wn' .. i], -1) ~= n then
    set(S, 'wn' .. i, n)
    set(S, 'wc' .. i, 0)
    set(S, 'wf' .. i, 0)
  end
  set(S, 'wc' .. i, num(S['wc' .. i]) + calls)
  set(S, 'wf' .. i, num(S['wf' .. i]) + fails)
end

local function window_sum(S, c, now)
  local n = math.floor(now / bucket_ms(c))
  local calls, fails = 0, 0
  for i = 0, c.window_buckets - 1 do
    local bn = num(S['wn' .. i], -1)
    if bn > n - c.window_buckets and bn <= n then
      calls = calls + num(S['wc' .. i])
      fails = fails + num(S['wf' .. i])
    end
  end
  return calls, fails
end

local function window_clear(S, c)
  for i = 0, c.window_buckets - 1 do
    if S['wn' .. i] ~= nil then set(S, 'wn' .. i, -1) end
  end
end

-- Share of the sender rate allowed while ramping up after a close (1 when not ramping).
local function ramp_fraction(S, c, now)
  local rc = num(S.rc)
  if rc <= 0 or num(c.ramp_ms) <= 0 then return 1 end
  local p = (now - rc) / c.ramp_ms
  if p >= 1 or p < 0 then return 1 end
  local start = math.max(0.01, math.min(1, num(c.ramp_start, 0.1)))
  return start + (1 - start) * p
end

-- Sender token bucket at the ramped rate: returns tokens, cap, rate per second, reserve.
local function refill(S, c, now, f)
  local cap = math.max(1, c.burst * f)
  local rate = math.max(0.000001, c.rate_per_s * f)
  local tk = tonumber(S.tk)
  local tt = num(S.tt, now)
  if tk == nil then tk = cap end
  if now > tt then tk = tk + (now - tt) * rate / 1000 end
  if tk > cap then tk = cap end
  local reserve = c.burst * c.reserve_fraction * f
  return tk, cap, rate, reserve
end

-- Meta usage percent, fading linearly to 0 over usage_ttl_ms after the report. A report is never trusted at
-- full strength for long: once low priority is paused, only priority traffic brings fresh reports, and a stale
-- high reading must not keep the pause in force for the whole ttl.
local function usage_level(S, c, now)
  local ua = num(S.ua)
  local ttl = num(c.usage_ttl_ms, 60000)
  local age = math.max(0, now - ua)
  if ua <= 0 or ttl <= 0 or age >= ttl then return 0 end
  return num(S.us) * (1 - age / ttl)
end

-- Moves the breaker to `to` and appends {from, to, now, reason} to T. Mints the incident id when the scope
-- leaves CLOSED and clears it when it closes again.
local function go(S, c, now, to, reason, T, rand, tag)
  local from = num(S.st, CLOSED)
  if from == to then return end
  local old_inc = S.inc or ''
  set(S, 'st', to)
  set(S, 'since', now)
  if to == OPEN or to == HALF_OPEN or to == FORCED_OPEN then
    if (S.inc or '') == '' then
      local t = redis.call('TIME')
      set(S, 'inc', string.format('%s-%d%06d', tag, tonumber(t[1]), tonumber(t[2])))
    end
  end
  if to == OPEN then
    local streak = num(S.streak) + 1
    set(S, 'streak', streak)
    set(S, 'trips', num(S.trips) + 1)
    local cd = c.cooldown_ms * (num(c.cooldown_growth, 2) ^ (streak - 1))
    cd = math.min(math.max(c.cooldown_ms, num(c.cooldown_max_ms)), cd)
    cd = cd * (1 + num(c.cooldown_jitter) * rand)
    set(S, 'ou', math.floor(now + cd))
  else
    set(S, 'ou', 0)
  end
  if to == HALF_OPEN then
    set(S, 'hs', 0)
    set(S, 'cc', 0)
  end
  if to == CLOSED then
    set(S, 'inc', '')
    set(S, 'streak', 0)
    set(S, 'rl', 0)
    window_clear(S, c)
    if reason ~= 'operator reset' and num(c.ramp_ms) > 0 and from ~= FORCED_CLOSED then
      set(S, 'rc', now)
    else
      set(S, 'rc', 0)
    end
  end
  local inc = S.inc or ''
  if inc == '' then inc = old_inc end
  T[#T + 1] = { from, to, now, reason, inc }
end

local function maybe_half_open(S, c, now, T, rand, tag)
  if num(S.st, CLOSED) == OPEN and now >= num(S.ou) then
    go(S, c, now, HALF_OPEN, 'cooldown ended', T, rand, tag)
  end
end

-- Common reply head: state, incident, open_until, calls, failures, now.
local function head(S, c, now)
  local calls, fails = window_sum(S, c, now)
  return { num(S.st, CLOSED), S.inc or '', num(S.ou), calls, fails, now }
end

local function append_transitions(out, T)
  for _, t in ipairs(T) do
    out[#out + 1] = t[1]
    out[#out + 1] = t[2]
    out[#out + 1] = t[3]
    out[#out + 1] = t[4]
    out[#out + 1] = t[5]
  end
  return out
end

-- Snapshot reply: head, then since, paused_until, pause_reason, ramp_fraction, trips, tokens, usage, streak.
local function snapshot(S, c, now)
  local out = head(S, c, now)
  local f = ramp_fraction(S, c, now)
  local tokens = refill(S, c, now, f)
  out[#out + 1] = num(S.since)
  out[#out + 1] = num(S.pu)
  out[#out + 1] = S.pr or ''
  out[#out + 1] = fmt(f)
  out[#out + 1] = num(S.trips)
  out[#out + 1] = fmt(tokens)
  out[#out + 1] = math.floor(usage_level(S, c, now) + 0.5)
  out[#out + 1] = num(S.streak)
  return out
end

