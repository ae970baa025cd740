-- admit_send.lua: admits a batch of sends of one sender scope in one round trip and hands out send slots.
--
-- Checks, per message and in this order: per-recipient order (order_wait: the recipient's order set holds an
-- earlier accepted operation still waiting; see order_register.lua), scope pause (its kind picks the code: paused, spam_paused,
-- registration_paused), the number's own pause (number_paused; below), breaker (OPEN / FORCED_OPEN deny; HALF_OPEN admits a bounded number of canaries per
-- second), Meta usage throttle, 131049 marketing deferral of the recipient, 131056 back-off of the pair, pair
-- rate (GCRA: emission interval pair_interval_ms, burst pair_burst; Meta's model is 6 s / 45, the default burst
-- is stricter), sender rate (token bucket at the effective rate, with a reserve only priority traffic may take;
-- replay needs extra headroom above the reserve so it only gets spare rate; older priority first, below), slow
-- throttle for low priority.
-- A message takes its tokens only when every check passes. The retry-after of a refusal for sender tokens is
-- its place in its class's fleet-wide waiting line (below): behind every message refused before it, in this
-- call or another's, one slot spacing each (at most 5 s ahead). An OPEN scope whose cooldown ended moves to
-- HALF_OPEN here.
--
-- Older priority first, fleet-wide: class "h" is priority traffic that goes before the rest of its class (a
-- dead-lettered priority message replayed from the rh lane, older than any live one, or a live one close to its
-- deadline). When an "h" message is refused for want of sender tokens, F.older_priority_waiting is set to
-- OLDER_PRIORITY_WAIT_MS past its place in the "h" waiting line; until then the sender's other priority messages
-- ("p") need a full bucket (spare rate only), so the "h" messages of every dispatcher get the sender's rate as
-- its tokens come, whichever process asks first. The rule lasts as long as they wait for tokens and ends
-- OLDER_PRIORITY_WAIT_MS after the last one in line was due back; an "h" message refused for another reason
-- (order, pair, pause) never starts it, so a stuck replay cannot hold live priority traffic.
--
-- Send slots: every admitted message gets a wait (ms from now, Redis time): the scope's slots are spaced
-- 1000 / effective_rate ms apart fleet-wide (F.next_slot), so the sends of every dispatcher reach Meta evenly at
-- the sender's current rate instead of in bunches. The caller sleeps for the wait right before the POST.
-- Effective rate = configured rate (rate_per_s, or Meta's stated throughput x throughput_margin) x ramp (after a
-- close or a pause) x adaptive share (AIMD on 130429) x blind_rate_factor while Meta sends no usage headers.
--
-- KEYS[1]    cfg hash of the scope (bw:{<waba>:<phone>}:cfg)
-- KEYS[2]    state hash of the scope (bw:{<waba>:<phone>}:state)
-- Order gate: a message whose operation id is a member of its recipient's order set while a member with a
-- lower score (an earlier acceptance) is still there is refused with order_wait, before any other check, so it
-- takes no token and never follows its predecessor into the DLQ on a breaker or pause refusal. A message that
-- is not a member (a category that does not keep order, or a set that expired) is not gated. Members of one
-- call are judged against the set as it is: the second message to a recipient in one batch waits for the
-- first's release (record_outcomes.lua), never overtakes it.
--
-- Number pause (parent_pause.lua on bw:{<waba>:<phone>}:pause; a registration, display-name or authentication
-- problem of this number alone): every message is refused with number_paused while it lasts (an untimed hold
-- with the hold's retry-after). After a probe pause ends, the first message that passes every check goes as the
-- probe (PF.probe_at) and the others wait PROBE_WINDOW_MS for its answer: another refusal pauses the number
-- again for twice as long, anything else lets it go on. The ramp after a number pause starts where it ended.
--
-- KEYS[2+i]    pair hash of message i (bw:{<waba>:<phone>}:pair:<recipient_key>; fields P)
-- KEYS[2+n+i]  order set of message i (bw:{<waba>:<phone>}:ord:<recipient_key>)
-- KEYS[3+2n]   the number's pause hash (bw:{<waba>:<phone>}:pause; fields PF)
-- KEYS[4+2n]   the number's throughput hash (bw:{<waba>:<phone>}:tput; fields TP): Meta's stated limit, which
--              sets the configured rate (throughput_rate in scope_prelude.lua); inbound messages ingest saw
--              already took their tokens from the bucket (observe_inbound.lua), so inbound plus outbound stays
--              under it
-- ARGV[1]      compiled defaults "name=value;..."
-- ARGV[2]      tag used in minted incident ids (the phone_number_id)
-- ARGV[3]      random number in [0, 1) for cooldown jitter
-- ARGV[4]      end (ms) of a parent pause (app / WABA / token) that just ended, or 0: starts a ramp from there
-- ARGV[4+i]    class of message i: "p" priority, "h" older priority (see above), "m" marketing, "r" replay
-- ARGV[4+n+i]  operation id of message i ('' : not gated)
-- Returns: { state, incident_id, open_until_ms, calls_in_window, failures_in_window, now_ms,
--            slot_gap_us (the scope's current slot spacing, microseconds),
--            code_1, retry_after_or_wait_ms_1, blocker_1, blocker_age_ms_1, ...,
--            then per transition: from, to, at_ms, reason, incident_id }
--   codes: CODE in scope_prelude.lua; for allow / canary the number is the slot wait, otherwise the retry-after;
--   blocker: for order_wait the earliest waiting operation id of the set and the ms since its registration,
--   else '' and 0

local now, c, S = begin()
local tag = ARGV[2]
local rand = num(ARGV[3])
local parent_end = num(ARGV[4])
local n = math.floor((#ARGV - 4) / 2)
local T = {}
-- The configured rate follows Meta's stated throughput of the number when it is known (throughput_rate).
c.rate_per_s = throughput_rate(c, KEYS[4 + 2 * n])

if parent_end > 0 then start_ramp(S, parent_end, num(c.pause_ramp_ms)) end
maybe_half_open(S, c, now, T, rand, tag)
local st = num(S[F.state], CLOSED)
local f = rate_factor(S, c, now)
local tokens, cap, rate, reserve = refill(S, c, now, f)
local usage = usage_level(S, c, now)
local pu = num(S[F.paused_until])
-- The number's own pause. The probe window covers the probe's answer (the dispatcher's request timeout is 10 s).
local PROBE_WINDOW_MS = 10000
local NP = KEYS[3 + 2 * n]
local np_retry, probe_open, probe_taken = 0, false, false
do
  local h = redis.call('HMGET', NP, PF.paused_until, PF.halted, PF.lift, PF.probe_at, PF.retry)
  local npu, pa = num(h[1]), num(h[4])
  if h[2] == '1' then
    np_retry = math.max(1, num(h[5], 600000))
  elseif npu > now then
    np_retry = npu - now
  elseif npu > 0 and h[3] == 'probe' then
    if pa >= npu and now < pa + PROBE_WINDOW_MS then
      np_retry = pa + PROBE_WINDOW_MS - now
    elseif pa < npu then
      probe_open = true
    end
  end
  if npu > 0 and npu <= now then start_ramp(S, npu, num(c.pause_ramp_ms)) end
end
local pause_code = PAUSE_CODE[num(S[F.pause_kind], PAUSE.rate_limit)] or CODE.paused
local sec = math.floor(now / 1000)
local cc = num(S[F.canary_count])
if num(S[F.canary_second]) ~= sec then cc = 0 end
local canaries = num(c.canaries_per_s, 1)
local pair_t = math.max(1, num(c.pair_interval_ms, 6000))
local pair_tol = pair_t * math.max(0, num(c.pair_burst, 1) - 1)
local lo = num(S[F.slow_tat])
local lo_t = 1000 / math.max(0.000001, rate * num(c.throttle_slow_factor, 0.5))
local slow = usage >= num(c.throttle_slow_percent, 80)
local stop_low = usage >= num(c.throttle_pause_percent, 90)
local slot_gap = 1000 / rate
local next_slot = math.max(now, num(S[F.next_slot]))
local pairs_seen = {}
local decisions = {}
local took = false
-- The waiting line for sender tokens, one per class and fleet-wide: each refusal for want of tokens is told to
-- come back when its tokens will have come and after everyone refused before it, in this call or another
-- dispatcher's (F.line_<class>: when the next refused one comes back; each refusal moves it one slot spacing
-- on). So the refused messages of every dispatcher come back one per slot, at the rate tokens come, instead of
-- all at once for the same token (at saturation, with three dispatchers, 35 refusals per admitted message and
-- most of Redis's time). It reserves nothing: a message that finds the tokens takes them.
-- The line is spaced at the configured rate, not the ramped one: a line built during a ramp would otherwise
-- send its messages back at the ramp's first, slow spacing long after the rate has grown (tokens then go
-- unused). The line adds at most LINE_HORIZON_MS to a wait (never less than the time its tokens take to come):
-- later refusals all come back then, since a wait fixed now cannot follow a rate that changes meanwhile.
local LINE = { p = F.line_p, h = F.line_h, m = F.line_m, r = F.line_r }
local LINE_HORIZON_MS = 5000
local line_gap = 1000 / math.max(0.000001, num(c.rate_per_s) * adaptive(S))
local lines = {}
local OLDER_PRIORITY_WAIT_MS = 1500
local older_waiting = num(S[F.older_priority_waiting])

local function pair_of(key)
  local p = pairs_seen[key]
  if p == nil then
    local h = redis.call('HMGET', key, P.tat, P.backoff_until, P.marketing_deferred)
    p = { tat = num(h[1], now), b = num(h[2]), md = num(h[3]), dirty = false }
    pairs_seen[key] = p
  end
  return p
end

-- The earliest member of order set `key` when it is not `op` (op being a member), else nil.
local function order_blocker(key, op)
  if op == '' then return nil end
  -- The common case (op is the earliest, or the set is gone) costs one command.
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[1] == nil or first[1] == op then return nil end
  if redis.call('ZSCORE', key, op) == false then return nil end
  return first[1], math.max(0, now - math.floor(tonumber(first[2]) / 1000))
end

for i = 1, n do
  local class = ARGV[4 + i]
  local low = class ~= 'p' and class ~= 'h'
  local code, retry = CODE.allow, 0
  local blocker, blocker_age = order_blocker(KEYS[2 + n + i], ARGV[4 + n + i] or '')
  if blocker ~= nil then
    code = CODE.order_wait
  elseif pu > now then
    code, retry = pause_code, pu - now
  elseif np_retry > 0 then
    code, retry = CODE.number_paused, np_retry
  elseif probe_taken then
    code, retry = CODE.number_paused, PROBE_WINDOW_MS
  elseif st == FORCED_OPEN then
    code, retry = CODE.forced_open, math.max(1000, num(c.cooldown_ms))
  elseif st == OPEN then
    code, retry = CODE.breaker_open, math.max(1, num(S[F.open_until]) - now)
  elseif low and stop_low and (now - num(S[F.usage_at]) < num(c.throttle_retry_ms, 5000)
      or now - num(S[F.throttle_probe]) < num(c.throttle_retry_ms, 5000)) then
    code, retry = CODE.throttled, num(c.throttle_retry_ms, 5000)
  elseif low and stop_low then
    -- Paused by a usage reading older than throttle_retry_ms, which Meta's answers alone refresh: one
    -- low-priority message per throttle_retry_ms
    -- goes as a probe, so a reading trusted for Meta's hourly window cannot keep marketing and replay paused
    -- after the usage fell (priority traffic may have ended: nothing else would refresh it).
    set(S, F.throttle_probe, now)
  elseif st == HALF_OPEN and cc >= canaries then
    code, retry = CODE.canary_budget, (sec + 1) * 1000 - now
  end
  local p, new_tat
  if code == CODE.allow then
    p = pair_of(KEYS[2 + i])
    local t0 = math.max(p.tat, now)
    if class == 'm' and p.md > now then
      code, retry = CODE.recipient_deferred, p.md - now
    elseif p.b > now then
      code, retry = CODE.pair_rate, p.b - now
    elseif t0 - now > pair_tol then
      code, retry = CODE.pair_rate, math.ceil(t0 - now - pair_tol)
    else
      new_tat = t0 + pair_t
    end
  end
  if code == CODE.allow then
    local need = 1
    if class == 'm' then need = reserve + 1 end
    if class == 'r' then need = reserve + num(c.replay_headroom, 2) + 1 end
    if class == 'p' and older_waiting > now then need = cap end
    -- A full bucket is spare rate by definition: while the adaptive share, a ramp or quota blindness shrink
    -- the bucket below the reserve plus the headroom, marketing and replay still go once it is full (else
    -- they would wait for ever: the share only grows back on successes).
    if need > cap then need = cap end
    if tokens < need then
      if tokens >= 1 then code = CODE.reserve else code = CODE.sender_rate end
      local line = LINE[class] or F.line_m
      local queue_end = math.min(lines[line] or num(S[line]), now + LINE_HORIZON_MS)
      local at = math.max(now + math.ceil((need - tokens) * 1000 / rate), queue_end)
      retry = at - now
      lines[line] = at + line_gap
      set(S, line, math.floor(lines[line]))
      if class == 'h' then
        -- Until the last "h" in line has come back (and OLDER_PRIORITY_WAIT_MS more).
        older_waiting = math.max(older_waiting, at + OLDER_PRIORITY_WAIT_MS)
        set(S, F.older_priority_waiting, older_waiting)
      end
    end
  end
  local new_lo
  if code == CODE.allow and low and slow then
    local t0 = math.max(lo, now)
    if t0 > now then
      code, retry = CODE.throttled, math.ceil(t0 - now)
    else
      new_lo = t0 + lo_t
    end
  end
  if code == CODE.allow then
    if probe_open and not probe_taken then
      probe_taken = true
      redis.call('HSET', NP, PF.probe_at, now)
    end
    tokens = tokens - 1
    took = true
    p.tat = new_tat
    p.dirty = true
    if new_lo ~= nil then lo = new_lo end
    retry = next_slot - now
    next_slot = next_slot + slot_gap
    if st == HALF_OPEN then
      code = CODE.canary
      cc = cc + 1
    end
  end
  decisions[#decisions + 1] = code
  decisions[#decisions + 1] = math.max(0, math.floor(retry))
  decisions[#decisions + 1] = blocker or ''
  decisions[#decisions + 1] = blocker_age or 0
end

if took then
  set(S, F.tokens, fmt(tokens))
  set(S, F.tokens_at, now)
  set(S, F.slow_tat, math.floor(lo))
  set(S, F.next_slot, math.floor(next_slot))
  if st == HALF_OPEN then
    set(S, F.canary_second, sec)
    set(S, F.canary_count, cc)
  end
  for key, p in pairs(pairs_seen) do
    if p.dirty then
      redis.call('HSET', key, P.tat, math.floor(p.tat))
      -- Lives until its latest time; a 131056 count outlives its back-off by at least the next interval.
      redis.call('PEXPIRE', key, math.max(1, math.floor(math.max(p.tat, p.b + pair_t, p.md) - now)))
    end
  end
end
if ramp_fraction(S, c, now) >= 1 and num(S[F.ramp_start]) > 0 then set(S, F.ramp_start, 0) end

local out = head(S, c, now)
out[#out + 1] = math.floor(slot_gap * 1000)
for _, v in ipairs(decisions) do out[#out + 1] = v end
return finish(S, out, T)
