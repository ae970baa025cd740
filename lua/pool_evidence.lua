-- pool_evidence.lua: the fast trip's evidence pooled over every number of one access token.
--
-- Meta fails a token's (app's) numbers together in an outage (reference §2 scopes: the token and app scopes are
-- above every number), so the calls of all its numbers are evidence of one question: is the token failing at
-- fast_trip_outage_rate rather than at failure_threshold? Four numbers answer four times the calls of one, which
-- is what it takes to tell a 20 % outage from 4 % noise within half a second (bw_breaker::evidence::Pool mirrors
-- this script; docs/decisions/pooled-evidence.md says why). Each number's batch adds the same CUSUM increment as
-- record_outcomes.lua's fast trip: ln(q/p) per transient failure, ln((1-q)/(1-p)) per success, summed per batch
-- before the clamp at 0, so the order within a batch does not matter. The pool trips when its evidence reaches
-- ARGV[2] (BreakerConfig::pool_trip_evidence) and fast_trip_failures distinct recipients (of any number) failed
-- within fast_trip_window_ms of the first. It then names the numbers that contributed: a transient failure
-- within fast_trip_window_ms and evidence of their own above 0 (the same CUSUM over the number's calls alone).
-- A number with no failure, or whose failures its successes outweigh, is never named: one failing number among
-- healthy ones gains no pooled evidence (their successes outweigh it) and trips on its own checks alone. A trip
-- spends the evidence: the pool and the named numbers' own evidence start again at 0. The caller opens each
-- named number through pool_trip.lua on the number's own slot.
-- The config is the compiled defaults only (ARGV[1]): the pool has no scope, so per-scope cfg hashes (their own
-- slots) do not apply to it.
--
-- KEYS[1]  bw:{tok:<token fingerprint>}:pool (bw:{app:<app key>}:pool when no token is set): its own slot
--          Fields: ev pooled evidence; fs, ft, fk the distinct-recipient window (start, count, '|k|k|');
--          e:<waba:phone> a number's own evidence; l:<waba:phone> its last transient failure (ms).
-- ARGV[1]  compiled defaults "name=value;..." (failure_threshold, fast_trip_outage_rate, fast_trip_failures,
--          fast_trip_window_ms)
-- ARGV[2]  evidence that trips the pool (<= 0: off, nothing is recorded)
-- ARGV[3]  the batch's number, "<waba>:<phone_number_id>"
-- ARGV[4]  calls in the batch: successes and transient failures (canaries and other outcomes left out)
-- ARGV[5..] the recipient key of each transient failure (#ARGV - 4 failures)
-- Returns: { pooled evidence after the batch (string, %.17g), tripped (1 / 0), the named numbers... }
-- The key lives keep_ms (10 min) past its last write.

local key = KEYS[1]
local c = {}
for k, v in string.gmatch(ARGV[1], '([%w_]+)=([^;]*)') do c[k] = tonumber(v) end
local needed = num(ARGV[2])
local member = ARGV[3]
local calls = num(ARGV[4])
local fails = #ARGV - 4
local p, q = num(c.failure_threshold, 0.05), num(c.fast_trip_outage_rate, 0.2)
local guard, win = num(c.fast_trip_failures, 3), num(c.fast_trip_window_ms, 2000)
if needed <= 0 or guard <= 0 or p <= 0 or q <= p or q >= 1 or calls <= 0 or fails > calls then
  return { '0', 0 }
end
local now = now_ms()
local keep_ms = 600000

local h = redis.call('HGETALL', key)
local S = {}
for i = 1, #h, 2 do S[h[i]] = h[i + 1] end
local W = {}
local function put(k, v)
  S[k] = v
  W[#W + 1] = k
  W[#W + 1] = v
end

-- The same expression as record_outcomes.lua's fast_llr, so both round alike.
local llr = fails * math.log(q / p) + (calls - fails) * math.log((1 - q) / (1 - p))

-- Distinct failing recipients within win of the first (as record_outcomes.lua's fast_failure).
local function open()
  local fs = num(S.fs)
  return fs > 0 and now - fs <= win
end
for i = 5, #ARGV do
  if not open() then
    put('fs', now)
    put('ft', 0)
    put('fk', '|')
  end
  local keys = S.fk or '|'
  if string.find(keys, '|' .. ARGV[i] .. '|', 1, true) == nil then
    put('ft', num(S.ft) + 1)
    if num(S.ft) <= guard then put('fk', keys .. ARGV[i] .. '|') end
  end
end

put('e:' .. member, string.format('%.17g', math.max(0, num(S['e:' .. member]) + llr)))
if fails > 0 then put('l:' .. member, now) end
local ev = math.max(0, num(S.ev) + llr)
put('ev', string.format('%.17g', ev))

local out = { S.ev, 0 }
if ev >= needed and open() and num(S.ft) >= guard then
  out[2] = 1
  local named = {}
  for k, v in pairs(S) do
    if string.sub(k, 1, 2) == 'l:' and now - num(v) <= win and num(S['e:' .. string.sub(k, 3)]) > 0 then
      named[#named + 1] = string.sub(k, 3)
    end
  end
  table.sort(named)
  for _, m in ipairs(named) do
    out[#out + 1] = m
    put('e:' .. m, '0')
  end
  put('ev', '0')
end
redis.call('HSET', key, unpack(W))
redis.call('PEXPIRE', key, keep_ms)
return out
