-- record_outcomes.lua: records a batch of send outcomes of one sender scope and runs the breaker.
--
-- Transient upstream errors (5xx, 131000, timeouts) and throughput rate limits (130429) count as failures in the
-- sliding window; successes count as calls; permanent client errors and the other rate limits (pair, spam,
-- WABA, app) count as neither. CLOSED trips to OPEN when failures / calls reaches the
-- threshold with at least min_calls calls in the window, or after consecutive_rate_limits sender-level rate
-- limits in a row. HALF_OPEN closes after close_after_successes canary successes and re-opens on a failure.
-- Rate limits pause their scope (sender-level: the whole scope until now + pause; pair: that recipient), and
-- credential errors pause the scope. FORCED_* states never change here.
--
-- KEYS[1]    cfg hash of the scope
-- KEYS[2]    state hash of the scope
-- KEYS[2+i]  pair key of outcome i
-- ARGV[1]    compiled defaults "name=value;..."
-- ARGV[2]    tag used in minted incident ids (the phone_number_id)
-- ARGV[3]    random number in [0, 1) for cooldown jitter
-- ARGV[4+3(i-1)]  kind of outcome i: "s" success, "t" transient, "x" permanent, "c" credentials,
--                 "rr" pair rate limit, "r:<label>" other rate limit (throughput, spam, waba, app)
-- ARGV[5+3(i-1)]  pause in ms for rate limits and credentials (0 otherwise)
-- ARGV[6+3(i-1)]  1 when the send was admitted as a canary, else 0
-- Returns: { state, incident_id, open_until_ms, calls_in_window, failures_in_window, now_ms,
--            paused_until_ms, then per transition: from, to, at_ms, reason, incident_id }

local now = now_ms()
local c = load_cfg(ARGV[1], KEYS[1])
local S = load_state(KEYS[2])
local tag = ARGV[2]
local rand = num(ARGV[3])
local n = math.floor((#ARGV - 3) / 3)
local T = {}

maybe_half_open(S, c, now, T, rand, tag)

local function pause(ms, reason)
  local until_ms = now + ms
  if until_ms > num(S.pu) then
    set(S, 'pu', until_ms)
    set(S, 'pr', reason)
  end
end

-- One failed call: into the window, then trip when HALF_OPEN, or when CLOSED and the rate crosses the threshold.
local function failure(st)
  window_add(S, c, now, 1, 1)
  if st == HALF_OPEN then
    go(S, c, now, OPEN, 'failure while half open', T, rand, tag)
  elseif st == CLOSED then
    local calls, fails = window_sum(S, c, now)
    if calls > 0 and calls >= num(c.min_calls, 50) and fails >= calls * num(c.failure_threshold, 0.05) then
      go(S, c, now, OPEN, string.format('failure rate %.3f over %d calls', fails / calls, calls), T, rand, tag)
    end
  end
end

for i = 1, n do
  local kind = ARGV[4 + 3 * (i - 1)]
  local pause_ms = num(ARGV[5 + 3 * (i - 1)])
  local canary = ARGV[6 + 3 * (i - 1)] == '1'
  local st = num(S.st, CLOSED)
  if kind == 's' then
    set(S, 'rl', 0)
    window_add(S, c, now, 1, 0)
    if st == HALF_OPEN and canary then
      set(S, 'hs', num(S.hs) + 1)
      if num(S.hs) >= num(c.close_after_successes, 5) then
        go(S, c, now, CLOSED, 'canaries succeeded', T, rand, tag)
      end
    end
  elseif kind == 't' then
    set(S, 'rl', 0)
    failure(st)
  elseif kind == 'rr' then
    local key = KEYS[2 + i]
    local until_ms = now + pause_ms
    if until_ms > num(redis.call('GET', key)) then
      redis.call('SET', key, until_ms, 'PX', math.max(1, pause_ms))
    end
  elseif string.sub(kind, 1, 2) == 'r:' then
    set(S, 'rl', num(S.rl) + 1)
    pause(pause_ms, 'rate limit: ' .. string.sub(kind, 3))
    if kind == 'r:throughput' then
      failure(st)
      st = num(S.st, CLOSED)
    end
    if (st == CLOSED or st == HALF_OPEN) and num(S.rl) >= num(c.consecutive_rate_limits, 5) then
      go(S, c, now, OPEN, string.format('%d consecutive rate limits', num(S.rl)), T, rand, tag)
    end
  elseif kind == 'c' then
    set(S, 'rl', 0)
    pause(pause_ms, 'credentials')
  else
    set(S, 'rl', 0)
  end
end

save_state(S, KEYS[2])
local out = head(S, c, now)
out[#out + 1] = num(S.pu)
return append_transitions(out, T)
