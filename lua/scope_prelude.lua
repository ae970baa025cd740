-- scope_prelude.lua: shared definitions and functions of the scope scripts (breaker, window, limits).
--
-- This file is not a script on its own: bw-breaker prepends it to each `*_*.lua` script of this directory
-- (admit_send, record_outcomes, tick_scope, read_scope, force_breaker, observe_usage, parent_pause,
-- order_register, order_release, claim_late, pool_evidence, pool_trip) before
-- loading, so the state machine, the codes and the field names are written once. It reads and writes nothing by
-- itself. The tables CODE, OUT, PAUSE, F, P and PF below are the only definitions of the decision codes, outcome
-- kinds, pause kinds and hash field names; `bw_breaker::scripts` mirrors them and a test (tests/it/scripts.rs)
-- loads this file into a real Redis and checks the two sides agree.
--
-- Conventions shared by every scope script:
--   KEYS[1]  bw:{<waba>:<phone>}:cfg    hash of per-scope config written by the coordinator (may be missing)
--   KEYS[2]  bw:{<waba>:<phone>}:state  hash holding breaker state, sliding window, sender bucket, pause, usage
--   ARGV[1]  compiled defaults "name=value;name=value;..." overlaid by the cfg hash field by field
-- Clock: Redis server time (TIME), never the caller's.
-- Keys of other scopes (app, WABA, token) live in their own hash slot and are only touched by parent_pause.lua;
-- the number's own pause key shares the scope's tag, so admit_send.lua and the snapshot scripts read it too.

-- Breaker states (bw.v1.BreakerState numbers).
local CLOSED, OPEN, HALF_OPEN, FORCED_OPEN, FORCED_CLOSED = 1, 2, 3, 4, 5

-- Decision codes of admit_send.lua (bw_breaker::scripts::Code).
local CODE = {
  allow = 0, canary = 1, breaker_open = 2, forced_open = 3, paused = 4, sender_rate = 5, pair_rate = 6,
  reserve = 7, throttled = 8, canary_budget = 9, spam_paused = 10, recipient_deferred = 11,
  registration_paused = 12, order_wait = 13, number_paused = 14,
}

-- Outcome kinds accepted by record_outcomes.lua (bw_breaker::scripts::Out).
local OUT = {
  success = 's', transient = 't', permanent = 'x', credentials = 'c', pair = 'rr', throughput = 'r:throughput',
  spam = 'r:spam', registration = 'r:registration', deferred = 'd', neutral = 'n',
}

-- Pause kinds stored in F.pause_kind: what paused the scope, which decides the deny code.
local PAUSE = { rate_limit = 1, spam = 2, credentials = 3, registration = 4 }
local PAUSE_CODE = { [1] = CODE.paused, [2] = CODE.spam_paused, [3] = CODE.paused, [4] = CODE.registration_paused }

-- Fields of the scope state hash (KEYS[2]).
local F = {
  state = 'st', since = 'since', incident = 'inc', open_until = 'ou', streak = 'streak', trips = 'trips',
  half_open_successes = 'hs', canary_second = 'cs', canary_count = 'cc', ramp_start = 'rc', ramp_ms = 'rm',
  rate_limit_streak = 'rl', paused_until = 'pu', pause_reason = 'pr', pause_kind = 'pk', tokens = 'tk',
  tokens_at = 'tt', slow_tat = 'lo', usage = 'us', usage_at = 'ua', no_usage_at = 'nv', adaptive = 'ar',
  adaptive_cut_at = 'ad', next_slot = 'ns', fast_count = 'ft', fast_since = 'fs',
  -- the fast trip's evidence (a CUSUM of log-likelihood ratios, record_outcomes.lua; bw_breaker::evidence)
  fast_evidence = 'fe',
  -- the share before a rate-limit episode's first cut, and when a 130429 last really cut it (record_outcomes.lua)
  adaptive_before_cut = 'ab', adaptive_last_cut = 'ak',
  fast_keys = 'fk', throttle_probe = 'tq', late_tokens = 'lk', late_at = 'la', older_priority_waiting = 'hw',
  -- the fleet-wide waiting line of each class for sender tokens (admit_send.lua): when the next refused one comes back
  line_p = 'wp', line_h = 'wh', line_m = 'wm', line_r = 'wr',
  -- window ring: F.win_* .. i for slot i (bucket number, calls, failures)
  win_bucket = 'wn', win_calls = 'wc', win_fails = 'wf',
}

-- Fields of a pair hash (bw:{<waba>:<phone>}:pair:<recipient_key>).
local P = { tat = 't', backoffs = 'x', backoff_until = 'b', marketing_deferred = 'md' }

-- Fields of a pause hash (parent_pause.lua): the number's own (bw:{<waba>:<phone>}:pause), its WABA's
-- (bw:{waba:<id>}:pause), app's (bw:{app:<id>}:pause) and access token's (bw:{tok:<hash>}:halt).
--   paused_until  end of a timed pause (ms; 0 or past: none)   halted     1: until lifted (no end)
--   reason, code  why (text, Meta code)                        since      start of the pause (ms)
--   source        answer, webhook or operator                  lift       time, probe, operator or new_token
--   length        last pause length (ms): a probe pause doubles it   probe_at  when the probe after it went
--   marketing     1: holds marketing messages only             retry      retry-after of an untimed hold (ms)
local PF = {
  paused_until = 'pu', reason = 'pr', halted = 'h', code = 'c', since = 's', source = 'o', lift = 'l',
  length = 'n', probe_at = 'pa', marketing = 'm', retry = 'rt',
}


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
  -- The threshold compare is exact integer arithmetic in per-mille (0.07 trips at exactly 7 %; resolution 0.1 %).
  c.threshold_permille = math.floor(num(c.failure_threshold, 0.05) * 1000 + 0.5)
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

-- Common head of every scope script: server time, config (defaults in ARGV[1] overlaid by the cfg hash), state.
local function begin()
  local now = now_ms()
  local c = load_cfg(ARGV[1], KEYS[1])
  local S = load_state(KEYS[2])
  return now, c, S
end

-- Sliding window of window_buckets sub-buckets of window_ms / window_buckets each.
local function bucket_ms(c)
  return math.max(1, math.floor(c.window_ms / c.window_buckets))
end

local function window_add(S, c, now, calls, fails)
  local n = math.floor(now / bucket_ms(c))
  local i = n % c.window_buckets
  local wn, wc, wf = F.win_bucket .. i, F.win_calls .. i, F.win_fails .. i
  if num(S[wn], -1) ~= n then
    set(S, wn, n)
    set(S, wc, 0)
    set(S, wf, 0)
  end
  set(S, wc, num(S[wc]) + calls)
  set(S, wf, num(S[wf]) + fails)
end

local function window_sum(S, c, now)
  local n = math.floor(now / bucket_ms(c))
  local calls, fails = 0, 0
  for i = 0, c.window_buckets - 1 do
    local bn = num(S[F.win_bucket .. i], -1)
    if bn > n - c.window_buckets and bn <= n then
      calls = calls + num(S[F.win_calls .. i])
      fails = fails + num(S[F.win_fails .. i])
    end
  end
  return calls, fails
end

local function window_clear(S, c)
  for i = 0, c.window_buckets - 1 do
    if S[F.win_bucket .. i] ~= nil then set(S, F.win_bucket .. i, -1) end
  end
end

-- Share of the sender rate allowed while ramping up (1 when not ramping). A ramp starts when the breaker closes
-- (over ramp_ms) and when a pause ends (over pause_ramp_ms, starting at the pause's end): after any pause the
-- backlog is released gradually, never at once.
local function ramp_fraction(S, c, now)
  local rc = num(S[F.ramp_start])
  local rm = num(S[F.ramp_ms], num(c.ramp_ms))
  if rc <= 0 or rm <= 0 then return 1 end
  local start = math.max(0.01, math.min(1, num(c.ramp_start, 0.1)))
  local p = (now - rc) / rm
  if p >= 1 then return 1 end
  if p < 0 then return start end
  return start + (1 - start) * p
end

local function start_ramp(S, from_ms, length_ms)
  if length_ms <= 0 then return end
  if from_ms + length_ms > num(S[F.ramp_start]) + num(S[F.ramp_ms]) then
    set(S, F.ramp_start, math.floor(from_ms))
    set(S, F.ramp_ms, math.floor(length_ms))
  end
end

-- Last Meta usage percent, trusted for Meta's real window: usage is an hourly rolling window, so a reading fades
-- linearly to 0 over usage_ttl_ms (default one hour; a 95 % reading stays above 90 % for over three minutes).
local function usage_level(S, c, now)
  local ua = num(S[F.usage_at])
  local ttl = num(c.usage_ttl_ms, 3600000)
  local age = math.max(0, now - ua)
  if ua <= 0 or ttl <= 0 or age >= ttl then return 0 end
  return num(S[F.usage]) * (1 - age / ttl)
end

-- True when the latest answer of Meta carried no usage headers (a later answer with them ends it): quota blind.
local function quota_blind(S)
  return num(S[F.no_usage_at]) > num(S[F.usage_at])
end

-- Learned share of the configured rate (AIMD: x aimd_decrease on a 130429, + aimd_increase per success).
local function adaptive(S)
  return math.max(0.01, math.min(1, num(S[F.adaptive], 1)))
end

-- Effective sender rate factor: ramp x adaptive x (blind_rate_factor while quota blind).
local function rate_factor(S, c, now)
  local f = ramp_fraction(S, c, now) * adaptive(S)
  if quota_blind(S) then f = f * math.max(0.01, math.min(1, num(c.blind_rate_factor, 1))) end
  return f
end

-- Sender token bucket at the effective rate: returns tokens, cap, rate per second, reserve.
local function refill(S, c, now, f)
  local cap = math.max(1, c.burst * f)
  local rate = math.max(0.000001, c.rate_per_s * f)
  local tk = tonumber(S[F.tokens])
  local tt = num(S[F.tokens_at], now)
  if tk == nil then tk = cap end
  if now > tt then tk = tk + (now - tt) * rate / 1000 end
  if tk > cap then tk = cap end
  local reserve = c.burst * c.reserve_fraction * f
  return tk, cap, rate, reserve
end

-- Pauses the whole scope until now + ms (never shortens a longer pause), with its kind and reason; the ramp
-- starts where the pause ends.
local function pause(S, c, now, ms, kind, reason)
  local until_ms = now + ms
  if until_ms > num(S[F.paused_until]) then
    set(S, F.paused_until, until_ms)
    set(S, F.pause_reason, reason)
    set(S, F.pause_kind, kind)
    -- The ramp is as long as twice the pause (at least 1 s), at most pause_ramp_ms: a 1 s 130429 pause ramps
    -- for 2 s, a 10 min spam pause for pause_ramp_ms.
    start_ramp(S, until_ms, math.min(num(c.pause_ramp_ms), math.max(1000, 2 * ms)))
  end
end

-- Moves the breaker to `to` and appends {from, to, now, reason} to T. Mints the incident id when the scope
-- leaves CLOSED and clears it when it closes again.
local function go(S, c, now, to, reason, T, rand, tag)
  local from = num(S[F.state], CLOSED)
  if from == to then return end
  local old_inc = S[F.incident] or ''
  set(S, F.state, to)
  set(S, F.since, now)
  if to == OPEN or to == HALF_OPEN or to == FORCED_OPEN then
    if (S[F.incident] or '') == '' then
      local t = redis.call('TIME')
      set(S, F.incident, string.format('%s-%d%06d', tag, tonumber(t[1]), tonumber(t[2])))
    end
  end
  if to == OPEN then
    local streak = num(S[F.streak]) + 1
    set(S, F.streak, streak)
    set(S, F.trips, num(S[F.trips]) + 1)
    -- Jitter is applied inside the cap: the cooldown never exceeds max(cooldown_ms, cooldown_max_ms).
    local cd = c.cooldown_ms * (num(c.cooldown_growth, 2) ^ (streak - 1))
    cd = cd * (1 + num(c.cooldown_jitter) * rand)
    cd = math.min(math.max(c.cooldown_ms, num(c.cooldown_max_ms)), cd)
    set(S, F.open_until, math.floor(now + cd))
  else
    set(S, F.open_until, 0)
  end
  if to == HALF_OPEN then
    set(S, F.half_open_successes, 0)
    set(S, F.canary_count, 0)
  end
  if to == CLOSED then
    set(S, F.incident, '')
    set(S, F.streak, 0)
    set(S, F.rate_limit_streak, 0)
    set(S, F.fast_count, 0)
    set(S, F.fast_evidence, 0)
    set(S, F.fast_keys, '')
    window_clear(S, c)
    if reason ~= 'operator reset' and num(c.ramp_ms) > 0 and from ~= FORCED_CLOSED then
      set(S, F.ramp_start, now)
      set(S, F.ramp_ms, num(c.ramp_ms))
    else
      set(S, F.ramp_start, 0)
    end
  end
  local inc = S[F.incident] or ''
  if inc == '' then inc = old_inc end
  T[#T + 1] = { from, to, now, reason, inc }
end

local function maybe_half_open(S, c, now, T, rand, tag)
  if num(S[F.state], CLOSED) == OPEN and now >= num(S[F.open_until]) then
    go(S, c, now, HALF_OPEN, 'cooldown ended', T, rand, tag)
  end
end

-- Opens the breaker on transient failures (an outage: record_outcomes.lua's checks, pool_trip.lua) and gives
-- back what 130429s cut from the adaptive share within the window before it. Such answers came with the outage,
-- whose answers mix errors and throttles at any rate; the cut was made before the failures showed. Kept, the
-- share stayed at 0.7^k through the OPEN time and the backlog drained at that fraction for 5-10 s after the
-- close, past its recovery bound (the drill). Safe: the ramp after the close starts at ramp_start of the rate and
-- probes throughput again, and a 130429 at throughput without failures then cuts.
local function outage_trip(S, c, now, reason, T, rand, tag)
  if now - num(S[F.adaptive_last_cut]) <= c.window_ms and num(S[F.adaptive_before_cut]) > adaptive(S) then
    set(S, F.adaptive, S[F.adaptive_before_cut])
  end
  set(S, F.adaptive_last_cut, 0)
  go(S, c, now, OPEN, reason, T, rand, tag)
end

-- Common reply head: state, incident, open_until, calls, failures, now.
local function head(S, c, now)
  local calls, fails = window_sum(S, c, now)
  return { num(S[F.state], CLOSED), S[F.incident] or '', num(S[F.open_until]), calls, fails, now }
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

-- Snapshot reply: head, then since, paused_until, pause_reason, ramp_fraction, trips, tokens, usage, streak,
-- adaptive share, quota visibility (1 seen, 0 blind, -1 unknown), next slot wait ms.
local function snapshot(S, c, now)
  local out = head(S, c, now)
  local f = rate_factor(S, c, now)
  local tokens = refill(S, c, now, f)
  out[#out + 1] = num(S[F.since])
  out[#out + 1] = num(S[F.paused_until])
  out[#out + 1] = S[F.pause_reason] or ''
  out[#out + 1] = fmt(ramp_fraction(S, c, now))
  out[#out + 1] = num(S[F.trips])
  out[#out + 1] = fmt(tokens)
  out[#out + 1] = math.floor(usage_level(S, c, now) + 0.5)
  out[#out + 1] = num(S[F.streak])
  out[#out + 1] = fmt(adaptive(S))
  local vis = -1
  if quota_blind(S) then vis = 0 elseif num(S[F.usage_at]) > 0 then vis = 1 end
  out[#out + 1] = vis
  out[#out + 1] = math.max(0, num(S[F.next_slot]) - now)
  return out
end

-- Common tail of every scope script: saves the changed fields and returns `out` with the transitions appended.
local function finish(S, out, T)
  save_state(S, KEYS[2])
  return append_transitions(out, T)
end

-- Appends the number's pause (hash KEYS[key_index], fields PF) to `out`: paused_until, halted (1 / 0), reason,
-- code, since, source, lift, marketing (1 / 0). A pause that ended is still reported while its key lives (a
-- probe pending, or the memory of its length); readers compare paused_until with now.
local function append_number_pause(out, key)
  local h = redis.call('HMGET', key, PF.paused_until, PF.halted, PF.reason, PF.code, PF.since, PF.source, PF.lift,
    PF.marketing)
  out[#out + 1] = num(h[1])
  out[#out + 1] = num(h[2])
  out[#out + 1] = h[3] or ''
  out[#out + 1] = num(h[4])
  out[#out + 1] = num(h[5])
  out[#out + 1] = h[6] or ''
  out[#out + 1] = h[7] or ''
  out[#out + 1] = num(h[8])
  return out
end

-- Fields of a number's throughput hash (bw:{<waba>:<phone>}:tput; throughput_set.lua, observe_inbound.lua).
--   mps    Meta's stated throughput from its webhook (1000 after THROUGHPUT_UPGRADE)   at, event  when, which
--   inbound  inbound messages counted against the number's throughput (a running total, for operators)
local TP = { mps = 'mps', at = 'at', event = 'ev', inbound = 'in' }

-- The number's configured sender rate from Meta's stated throughput (meta-cloud-api.md §3.1, which counts inbound
-- and outbound): the limit Meta's webhook recorded in the throughput hash `key`, else config's throughput_mps.
-- Unknown (0): rate_per_s as configured. Known: limit x throughput_margin, never above the limit itself.
local function throughput_rate(c, key)
  local limit = num(redis.call('HGET', key, TP.mps))
  if limit <= 0 then limit = num(c.throughput_mps) end
  if limit <= 0 then return c.rate_per_s end
  return limit * math.max(0.01, math.min(1, num(c.throughput_margin, 0.925)))
end
