-- admit_send.lua: admits a batch of sends of one sender scope in one round trip.
--
-- Checks, per message and in this order: fleet-wide pause, breaker (OPEN / FORCED_OPEN deny; HALF_OPEN admits a
-- bounded number of canaries per second), Meta usage throttle, recipient-pair rate (GCRA, 131056 semantics),
-- sender rate (token bucket at the ramped rate, with a reserve only priority traffic may take; replay needs
-- extra headroom above the reserve so it only gets spare rate), slow throttle for low priority. A message
-- takes its tokens only when every check passes. The retry-after of a refusal for sender tokens counts the
-- messages refused before it in the same call (the n-th waits for n more tokens). An OPEN scope whose cooldown ended moves to HALF_OPEN here.
--
-- KEYS[1]    cfg hash of the scope (bw:{<waba>:<phone>}:cfg)
-- KEYS[2]    state hash of the scope (bw:{<waba>:<phone>}:state)
-- KEYS[2+i]  pair key of message i (bw:{<waba>:<phone>}:pair:<recipient_key>)
-- ARGV[1]    compiled defaults "name=value;..."
-- ARGV[2]    tag used in minted incident ids (the phone_number_id)
-- ARGV[3]    random number in [0, 1) for cooldown jitter
-- ARGV[3+i]  class of message i: "p" priority, "m" marketing, "r" replay
-- Returns: { state, incident_id, open_until_ms, calls_in_window, failures_in_window, now_ms,
--            code_1, retry_after_ms_1, ..., code_n, retry_after_ms_n,
--            then per transition: from, to, at_ms, reason, incident_id }
--   codes: 0 allow, 1 allow as canary, 2 breaker open, 3 forced open, 4 paused, 5 sender rate, 6 pair rate,
--          7 reserve, 8 throttled, 9 canary budget

local now = now_ms()
local c = load_cfg(ARGV[1], KEYS[1])
local S = load_state(KEYS[2])
local tag = ARGV[2]
local rand = num(ARGV[3])
local n = #ARGV - 3
local T = {}

maybe_half_open(S, c, now, T, rand, tag)
local st = num(S.st, CLOSED)
local f = ramp_fraction(S, c, now)
local tokens, cap, rate, reserve = refill(S, c, now, f)
local usage = usage_level(S, c, now)
local pu = num(S.pu)
local sec = math.floor(now / 1000)
local cc = num(S.cc)
if num(S.cs) ~= sec then cc = 0 end
local canaries = num(c.canaries_per_s, 1)
local pair_t = math.max(1, num(c.pair_interval_ms, 6000))
local pair_tol = pair_t * math.max(0, num(c.pair_burst, 1) - 1)
local lo = num(S.lo)
local lo_t = 1000 / math.max(0.000001, rate * num(c.throttle_slow_factor, 0.5))
local slow = usage >= num(c.throttle_slow_percent, 80)
local stop_low = usage >= num(c.throttle_pause_percent, 90)
local pair_tat = {}
local decisions = {}
local took = false
-- Messages of this call already refused for want of sender tokens: each later refusal is told to come back
-- after the ones before it have had their tokens, so a caller holding refused messages can re-submit each at
-- its own slot instead of all at once.
local queued = 0

for i = 1, n do
  local class = ARGV[3 + i]
  local low = class ~= 'p'
  local code, retry = 0, 0
  if pu > now then
    code, retry = 4, pu - now
  elseif st == FORCED_OPEN then
    code, retry = 3, math.max(1000, num(c.cooldown_ms))
  elseif st == OPEN then
    code, retry = 2, math.max(1, num(S.ou) - now)
  elseif low and stop_low then
    code, retry = 8, num(c.throttle_retry_ms, 5000)
  elseif st == HALF_OPEN and cc >= canaries then
    code, retry = 9, (sec + 1) * 1000 - now
  end
  local pkey = KEYS[2 + i]
  local new_pair
  if code == 0 then
    local tat = pair_tat[pkey]
    if tat == nil then tat = num(redis.call('GET', pkey), now) end
    local t0 = math.max(tat, now)
    if t0 - now > pair_tol then
      code, retry = 6, math.ceil(t0 - now - pair_tol)
    else
      new_pair = t0 + pair_t
    end
  end
  if code == 0 then
    local need = 1
    if class == 'm' then need = reserve + 1 end
    if class == 'r' then need = reserve + num(c.replay_headroom, 2) + 1 end
    if tokens < need then
      if tokens >= 1 then code = 7 else code = 5 end
      retry = math.ceil((need + queued - tokens) * 1000 / rate)
      queued = queued + 1
    end
  end
  local new_lo
  if code == 0 and low and slow then
    local t0 = math.max(lo, now)
    if t0 > now then
      code, retry = 8, math.ceil(t0 - now)
    else
      new_lo = t0 + lo_t
    end
  end
  if code == 0 then
    tokens = tokens - 1
    took = true
    pair_tat[pkey] = new_pair
    if new_lo ~= nil then lo = new_lo end
    if st == HALF_OPEN then
      code = 1
      cc = cc + 1
    end
  end
  decisions[#decisions + 1] = code
  decisions[#decisions + 1] = math.max(0, math.floor(retry))
end

if took then
  set(S, 'tk', fmt(tokens))
  set(S, 'tt', now)
  set(S, 'lo', math.floor(lo))
  if st == HALF_OPEN then
    set(S, 'cs', sec)
    set(S, 'cc', cc)
  end
  for key, tat in pairs(pair_tat) do
    redis.call('SET', key, math.floor(tat), 'PX', math.max(1, math.floor(tat - now)))
  end
end
if f >= 1 and num(S.rc) > 0 then set(S, 'rc', 0) end
save_state(S, KEYS[2])

local out = head(S, c, now)
for _, v in ipairs(decisions) do out[#out + 1] = v end
return append_transitions(out, T)
