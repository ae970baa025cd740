-- record_outcomes.lua: records a batch of send outcomes of one sender scope and runs the breaker.
--
-- What counts (OUT in scope_prelude.lua):
--   success       a call in the window and in the fast trip's evidence; resets the rate-limit streak and the
--                 pair's 131056 back-off; the adaptive share creeps back up by aimd_increase (never above 1)
--   transient     5xx, 131000, timeouts: a failed call in the window and in the fast-trip window
--   throughput    130429: never in the failure window (Meta §6: rate limits feed their limiter, not the health
--                 breaker); pauses the scope for pause_ms and starts a rate-limit episode at most once per
--                 aimd_cut_gap_ms (the sends in flight when Meta started refusing are answered together and
--                 count once): the adaptive share is cut to x aimd_decrease (not for a canary's answer, nor
--                 while the window's transient failures are at or above the threshold: an outage; a trip on
--                 transient failures within window_ms gives the cut back) and the episode streak grows (a
--                 success ends it)
--   pair          131056: never a failure; the pair backs off 4^X s (1, 4, 16, 64 s ..., X = consecutive 131056
--                 of the pair, capped at pair_backoff_max_ms) and its GCRA is treated as full from now on
--                 (Meta just said so). The hint in pause_ms is ignored: Meta gives none for 131056.
--   spam          131048: never a failure; pauses the scope for pause_ms with its own kind (deny code
--                 spam_paused)
--   registration  133016: never a failure; pauses the scope for pause_ms with kind registration
--   deferred      131049: never a failure; marketing to that recipient is deferred for max(pause_ms, 24 h)
--   credentials   pauses the scope for pause_ms (used only when the token is unknown; otherwise the token halt
--                 in parent_pause.lua covers every number on the token)
--   permanent     neither a call nor a failure; resets the rate-limit streak
--   neutral       nothing (app / WABA rate limits: recorded on their own keys by parent_pause.lua)
-- CLOSED trips to OPEN when the window holds at least min_calls calls and evidence that the number fails more
-- often than the threshold (failures * 1000 >= calls * threshold_permille, and the Wilson lower bound at
-- z = failure_z reaches it: failures - calls p >= z sqrt(calls p (1 - p)); checked once per batch), after
-- consecutive_rate_limits 130429 episodes with no success between, or on a fast trip: the evidence that the
-- number fails at fast_trip_outage_rate rather than at the threshold (a CUSUM of per-call log-likelihood
-- ratios, summed per batch, so the order within a batch does not matter) reaches fast_trip_evidence, and
-- fast_trip_failures distinct recipients failed within fast_trip_window_ms. The fast trip needs no min_calls,
-- so it trips even while rate-limit pauses keep the sliding window thin; one message failing on every retry is
-- one recipient, so retries alone never fast-trip. At the defaults (z 4.5; q 0.2, evidence 15), simulated at 75
-- calls/s: a steady 2 % or 4 % trips none of 4,000 ten-minute runs, a 20 % outage trips a number after a median
-- 1.3 s (p90 2.2 s; docs/performance.md, "Breaker trips on evidence"); the token's pooled evidence
-- (pool_evidence.lua, fed with the same batches) opens the numbers failing together sooner. HALF_OPEN closes after
-- close_after_successes canary successes and re-opens on a failure. FORCED_* states never change here.
--
-- KEYS[1]    cfg hash of the scope
-- KEYS[2]    state hash of the scope
-- KEYS[2+i]  pair hash of outcome i (fields P)
-- ARGV[1]    compiled defaults "name=value;..."
-- ARGV[2]    tag used in minted incident ids (the phone_number_id)
-- ARGV[3]    random number in [0, 1) for cooldown jitter
-- ARGV[4+3(i-1)]  kind of outcome i (OUT)
-- ARGV[5+3(i-1)]  pause in ms for throughput, spam, registration, deferred and credentials (0 otherwise)
-- ARGV[6+3(i-1)]  1 when the send was admitted as a canary, else 0
-- KEYS[2+n+j], ARGV[3+3n+j]  order set and operation id of release j (j = 1..m): the operation left its
--                 recipient's order set (Meta accepted it, or it ended where it can never be sent before a later
--                 one: BW_UNKNOWN, quarantine); the operations behind it may go (see order_register.lua)
--   n = (#ARGV - #KEYS - 1) / 2 outcomes, m = #KEYS - 2 - n releases.
-- Returns: { state, incident_id, open_until_ms, calls_in_window, failures_in_window, now_ms,
--            paused_until_ms, then per transition: from, to, at_ms, reason, incident_id }

local now, c, S = begin()
local tag = ARGV[2]
local rand = num(ARGV[3])
local n = math.floor((#ARGV - #KEYS - 1) / 2)
local m = #KEYS - 2 - n
local T = {}

maybe_half_open(S, c, now, T, rand, tag)

-- A trip on transient failures gives back the outage's adaptive cuts (outage_trip in scope_prelude.lua).
local function trip_on_failures(reason)
  outage_trip(S, c, now, reason, T, rand, tag)
end

-- The sliding window trips on evidence, not on the bare rate (bw_breaker::evidence::window_trips mirrors it):
-- at least min_calls calls, the rate at or above the threshold (exact per-mille compare), and the Wilson lower
-- bound of the rate, z = failure_z, at or above it too: fails - calls p >= z sqrt(calls p (1 - p)). A 10 s
-- window of 750 calls at a steady 4 % touches 5 % about once a minute, so the bare rate tripped healthy numbers.
-- Checked once per batch, after every outcome is in the window, so order within a batch does not matter.
local function window_trips(calls, fails)
  if calls <= 0 or calls < num(c.min_calls, 50) or fails * 1000 < calls * c.threshold_permille then return false end
  -- z 0 is the bare rate, decided by the exact compare above (7 - 100 * 0.07 is below 0 in floats).
  local p, z = num(c.failure_threshold, 0.05), num(c.failure_z, 4.5)
  return z <= 0 or fails - calls * p >= z * math.sqrt(calls * p * (1 - p))
end

local function trip_rate()
  if num(S[F.state], CLOSED) ~= CLOSED then return end
  local calls, fails = window_sum(S, c, now)
  if window_trips(calls, fails) then
    trip_on_failures(string.format('failure rate %.3f over %d calls (Wilson bound at z %g reaches %g)', fails / calls,
      calls, num(c.failure_z, 4.5), num(c.failure_threshold, 0.05)))
  end
end

-- One failed call: into the window, then trip when HALF_OPEN (the window is checked at the end of the batch).
local function failure(st)
  window_add(S, c, now, 1, 1)
  if st == HALF_OPEN then
    trip_on_failures('failure while half open')
  end
end

-- Fast trip (bw_breaker::evidence mirrors fast_llr and the update in fast_check): a CUSUM of log-likelihood
-- ratios. Each call weighs ln(q/p) when it failed and ln((1-q)/(1-p)) when it succeeded, p = failure_threshold
-- (the rate the breaker tolerates) and q = fast_trip_outage_rate (the outage to catch quickly); the evidence
-- is max(0, evidence + batch sum) and trips at fast_trip_evidence. Failures that are plausible at the
-- threshold rate never build evidence: at a steady 4 % it drifts down and stays near 0. A bare count did not
-- (3 failures in 50 calls happen at 2 % about once in twelve windows). The batch is summed before the clamp,
-- so the order of outcomes within a batch does not matter.
local function fast_llr(calls, fails)
  local p, q = num(c.failure_threshold, 0.05), num(c.fast_trip_outage_rate, 0.2)
  if p <= 0 or q <= p or q >= 1 then return nil end
  return fails * math.log(q / p) + (calls - fails) * math.log((1 - q) / (1 - p))
end

-- Distinct-recipient guard: a window of fast_trip_window_ms opened by a transient failure counts the distinct
-- recipients that failed in it, and the fast trip needs fast_trip_failures of them (a retried message failing
-- again is one failure, so retries alone never fast-trip).
local function fast_open()
  local fs = num(S[F.fast_since])
  return fs > 0 and now - fs <= num(c.fast_trip_window_ms, 2000)
end

local function fast_failure(key)
  if not fast_open() then
    set(S, F.fast_since, now)
    set(S, F.fast_count, 0)
    set(S, F.fast_keys, '|')
  end
  local keys = S[F.fast_keys] or '|'
  if string.find(keys, '|' .. key .. '|', 1, true) == nil then
    set(S, F.fast_count, num(S[F.fast_count]) + 1)
    if num(S[F.fast_count]) <= num(c.fast_trip_failures, 0) then set(S, F.fast_keys, keys .. key .. '|') end
  end
end

-- Once per batch, with the batch's calls (successes and transient failures) and transient failures.
local function fast_check(calls, fails)
  local need = num(c.fast_trip_failures, 0)
  if need <= 0 or num(S[F.state], CLOSED) ~= CLOSED or calls <= 0 then return end
  local llr = fast_llr(calls, fails)
  if llr == nil then return end
  local ev = math.max(0, num(S[F.fast_evidence]) + llr)
  set(S, F.fast_evidence, string.format('%.17g', ev))
  if ev >= num(c.fast_trip_evidence, 15) and fast_open() and num(S[F.fast_count]) >= need then
    local reason = string.format('fast trip: evidence %.1f >= %g (%d of %d calls failed in this batch, '
      .. '%d recipients within %d ms)', ev, num(c.fast_trip_evidence, 15), fails, calls, num(S[F.fast_count]),
      num(c.fast_trip_window_ms, 2000))
    trip_on_failures(reason)
  end
end

-- Writes pair fields and keeps the key `extra` ms past its latest time (never shortens its life): after a
-- 131056 the count X must outlive the back-off, or a send that comes back late would start again at 1 s.
local function pair_update(key, fields, extra)
  redis.call('HSET', key, unpack(fields))
  local h = redis.call('HMGET', key, P.tat, P.backoff_until, P.marketing_deferred)
  local keep = math.floor(math.max(num(h[1]), num(h[2]), num(h[3])) - now + extra)
  if keep > num(redis.call('PTTL', key)) then redis.call('PEXPIRE', key, math.max(1, keep)) end
end

local batch_calls, batch_fails = 0, 0
for i = 1, n do
  local kind = ARGV[4 + 3 * (i - 1)]
  local pause_ms = num(ARGV[5 + 3 * (i - 1)])
  local canary = ARGV[6 + 3 * (i - 1)] == '1'
  local key = KEYS[2 + i]
  local st = num(S[F.state], CLOSED)
  if kind == OUT.success then
    set(S, F.rate_limit_streak, 0)
    batch_calls = batch_calls + 1
    window_add(S, c, now, 1, 0)
    local ar = tonumber(S[F.adaptive])
    if ar ~= nil and ar < 1 then set(S, F.adaptive, fmt(math.min(1, ar + num(c.aimd_increase, 0.002)))) end
    if num(redis.call('HGET', key, P.backoffs)) > 0 then
      redis.call('HSET', key, P.backoffs, 0, P.backoff_until, 0)
    end
    if st == HALF_OPEN and canary then
      set(S, F.half_open_successes, num(S[F.half_open_successes]) + 1)
      if num(S[F.half_open_successes]) >= num(c.close_after_successes, 5) then
        go(S, c, now, CLOSED, 'canaries succeeded', T, rand, tag)
      end
    end
  elseif kind == OUT.transient then
    set(S, F.rate_limit_streak, 0)
    failure(st)
    batch_calls, batch_fails = batch_calls + 1, batch_fails + 1
    fast_failure(key)
  elseif kind == OUT.pair then
    local x = num(redis.call('HGET', key, P.backoffs)) + 1
    local backoff = math.min(num(c.pair_backoff_max_ms, 3600000), 1000 * (4 ^ (x - 1)))
    local tol = math.max(1, num(c.pair_interval_ms, 6000)) * math.max(0, num(c.pair_burst, 1) - 1)
    local tat = math.max(num(redis.call('HGET', key, P.tat)), now + tol)
    pair_update(key, { P.backoffs, x, P.backoff_until, math.floor(now + backoff), P.tat, math.floor(tat) },
      math.max(60000, 4 * backoff))
  elseif kind == OUT.throughput then
    pause(S, c, now, pause_ms, PAUSE.rate_limit, 'rate limit: throughput')
    -- One rate-limit episode per aimd_cut_gap_ms: the sends already in flight when Meta started refusing are
    -- answered 130429 together and must count once.
    if now - num(S[F.adaptive_cut_at]) >= num(c.aimd_cut_gap_ms, 1000) then
      -- A canary's 130429 says nothing about the sender's throughput: canaries go at canaries_per_s, a probe
      -- far below any number's limit, while the scope is HALF_OPEN (Meta unwell). Cutting on them left the
      -- share at 0.7^k after an outage of k such answers and the backlog drained at a fraction of the rate for
      -- 10-20 s after the close. They still pause the scope and count in the episode streak; the ramp after
      -- the close probes throughput again, and a 130429 at throughput then cuts.
      -- Nor does a 130429 while Meta is failing this number's calls: transient failures (5xx, 131000,
      -- timeouts) at or above the trip threshold in the window mean an outage, whose answers mix errors and
      -- throttles at any rate (the drill's outage cut a number to 0.15 at 26 msg/s, and its backlog then drained
      -- at a fraction of the rate for 15-20 s after the close). Such a window trips the breaker anyway once it
      -- holds min_calls; a number whose real limit is lower is still learned from 130429s without 5xx (a
      -- saturated number, a coexistence number at 20 msg/s), which is every 130429 at throughput.
      -- The same holds when Meta has failed calls to two or more recipients of this number within the fast-trip
      -- window: an outage's first seconds, before a window holding 10 s of healthy calls reaches the threshold
      -- (in the drill the 130429s of those seconds still cut numbers to 0.7 and 0.37, and each took 10-15 s
      -- to creep back after the close, past its recovery bound). A single 5xx beside a 130429 still cuts.
      local wc, wf = window_sum(S, c, now)
      local unwell = (wf > 0 and wf * 1000 >= wc * c.threshold_permille)
        or (fast_open() and num(S[F.fast_count]) >= 2)
      if not canary and not unwell then
        -- A trip on failures within the window gives this episode's cuts back (outage_trip).
        if now - num(S[F.adaptive_last_cut]) > c.window_ms then set(S, F.adaptive_before_cut, fmt(adaptive(S))) end
        set(S, F.adaptive_last_cut, now)
        set(S, F.adaptive, fmt(math.max(num(c.aimd_min, 0.1), adaptive(S) * num(c.aimd_decrease, 0.7))))
      end
      set(S, F.adaptive_cut_at, now)
      set(S, F.rate_limit_streak, num(S[F.rate_limit_streak]) + 1)
      local rl = num(S[F.rate_limit_streak])
      if (st == CLOSED or st == HALF_OPEN) and rl >= num(c.consecutive_rate_limits, 5) then
        go(S, c, now, OPEN, string.format('%d consecutive rate limits', rl), T, rand, tag)
      end
    end
  elseif kind == OUT.spam then
    pause(S, c, now, pause_ms, PAUSE.spam, 'spam restriction (131048)')
  elseif kind == OUT.registration then
    pause(S, c, now, pause_ms, PAUSE.registration, 'registration attempts limited (133016)')
  elseif kind == OUT.deferred then
    local until_ms = now + math.max(pause_ms, 86400000)
    if until_ms > num(redis.call('HGET', key, P.marketing_deferred)) then
      pair_update(key, { P.marketing_deferred, math.floor(until_ms) }, 1000)
    end
  elseif kind == OUT.credentials then
    set(S, F.rate_limit_streak, 0)
    pause(S, c, now, pause_ms, PAUSE.credentials, 'credentials')
  elseif kind == OUT.permanent then
    set(S, F.rate_limit_streak, 0)
  end
end

if batch_fails > 0 then trip_rate() end
fast_check(batch_calls, batch_fails)
for j = 1, m do
  redis.call('ZREM', KEYS[2 + n + j], ARGV[3 + 3 * n + j])
end
local out = head(S, c, now)
out[#out + 1] = num(S[F.paused_until])
return finish(S, out, T)
