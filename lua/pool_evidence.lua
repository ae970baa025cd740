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
-- A second, shorter test weighs only Meta's own statement that its service is unavailable (codes 2, 131016 and
-- 133004 in Meta's JSON error body; docs/decisions/pooled-evidence.md): the same CUSUM with each such answer
-- a failure at the tolerated rate ARGV[3] (0.01) instead of failure_threshold, every other call a success, and
-- its own trip level ARGV[4]. Ambiguous failures (a bodiless 5xx, a timeout, a reset, 131000) never feed it, so
-- the main test's noise guarantee holds for them unchanged; the drill's outage (Meta answering 503 with code 2
-- on 14 % of its calls, 130429 on another 14 %, each 130429 pausing the number for 1 s) trips it within 0.5 s.
-- The config is the compiled defaults only (ARGV[1]): the pool has no scope, so per-scope cfg hashes (their own
-- slots) do not apply to it.
--
-- KEYS[1]  bw:{tok:<token fingerprint>}:pool (bw:{app:<app key>}:pool when no token is set): its own slot
--          Fields: ev pooled evidence; fs, ft, fk the distinct-recipient window (start, count, '|k|k|');
--          e:<waba:phone> a number's own evidence; l:<waba:phone> its last transient failure (ms);
--          dv the second test's pooled evidence; d:<waba:phone> a number's own evidence of the second test.
-- ARGV[1]  compiled defaults "name=value;..." (failure_threshold, fast_trip_outage_rate, fast_trip_failures,
--          fast_trip_window_ms)
-- ARGV[2]  evidence that trips the pool (<= 0: off, nothing is recorded)
-- ARGV[3]  tolerated rate of Meta's declared unavailability (the second test; <= 0 or >= the outage rate: off)
-- ARGV[4]  evidence that trips the second test (<= 0: off)
-- ARGV[5]  the batch's number, "<waba>:<phone_number_id>"
-- ARGV[6]  calls in the batch: successes and transient failures (canaries and other outcomes left out)
-- ARGV[7]  how many of the failures are Meta's declared unavailability: the first ARGV[7] keys below
-- ARGV[8..] the recipient key of each transient failure (#ARGV - 7 failures)
-- Returns: { pooled evidence after the batch (string, %.17g), the second test's (string), tripped (0: no,
--            1: the main test, 2: the second test), the named numbers... }
-- The key lives keep_ms (10 min) past its last write.

local key = KEYS[1]
local c = {}
for k, v in string.gmatch(ARGV[1], '([%w_]+)=([^;]*)') do c[k] = tonumber(v) end
local needed = num(ARGV[2])
local pd, dneeded = num(ARGV[3]), num(ARGV[4])
local member = ARGV[5]
local calls = num(ARGV[6])
local declared = num(ARGV[7])
local fails = #ARGV - 7
local p, q = num(c.failure_threshold, 0.05), num(c.fast_trip_outage_rate, 0.2)
local guard, win = num(c.fast_trip_failures, 3), num(c.fast_trip_window_ms, 2000)
if needed <= 0 or guard <= 0 or p <= 0 or q <= p or q >= 1 or calls <= 0 or fails > calls
  or declared < 0 or declared > fails then
  return { '0', '0', 0 }
end
local second = dneeded > 0 and pd > 0 and pd < q
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
-- The second test: Meta's declared unavailability against its tolerated rate pd, every other call a success.
local dllr = 0
if second then dllr = declared * math.log(q / pd) + (calls - declared) * math.log((1 - q) / (1 - pd)) end

-- Distinct failing recipients within win of the first (as record_outcomes.lua's fast_failure).
local function open()
  local fs = num(S.fs)
  return fs > 0 and now - fs <= win
end
for i = 8, #ARGV do
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
local dv = 0
if second then
  put('d:' .. member, string.format('%.17g', math.max(0, num(S['d:' .. member]) + dllr)))
  dv = math.max(0, num(S.dv) + dllr)
  put('dv', string.format('%.17g', dv))
end

local out = { S.ev, S.dv or '0', 0 }
local which = 0
if ev >= needed then which = 1 elseif second and dv >= dneeded then which = 2 end
if which > 0 and open() and num(S.ft) >= guard then
  out[3] = which
  local named = {}
  for k, v in pairs(S) do
    local m = string.sub(k, 3)
    if string.sub(k, 1, 2) == 'l:' and now - num(v) <= win
      and (num(S['e:' .. m]) > 0 or num(S['d:' .. m]) > 0) then
      named[#named + 1] = m
    end
  end
  table.sort(named)
  for _, m in ipairs(named) do
    out[#out + 1] = m
    put('e:' .. m, '0')
    if second then put('d:' .. m, '0') end
  end
  put('ev', '0')
  if second then put('dv', '0') end
end
redis.call('HSET', key, unpack(W))
redis.call('PEXPIRE', key, keep_ms)
return out
