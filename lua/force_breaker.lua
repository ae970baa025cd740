-- force_breaker.lua: operator overrides of a scope's breaker.
--
-- "open" sets FORCED_OPEN (every send denied), "closed" sets FORCED_CLOSED (never trips; limits still
-- apply), "clear" returns a forced scope to CLOSED (with the usual ramp-up), "reset" wipes the window,
-- counters, pause, adaptive share, usage and incident and sets CLOSED without a ramp.
--
-- KEYS[1]  cfg hash of the scope
-- KEYS[2]  state hash of the scope
-- KEYS[3]  the number's pause hash (bw:{<waba>:<phone>}:pause; parent_pause.lua)
-- ARGV[1]  compiled defaults "name=value;..."
-- ARGV[2]  tag used in minted incident ids (the phone_number_id)
-- ARGV[3]  mode: "open", "closed", "clear" or "reset"
-- Returns: the read_scope.lua reply, then per transition: from, to, at_ms, reason, incident_id
--          (error "bad mode" for an unknown mode)

local now, c, S = begin()
local T = {}
local mode = ARGV[3]
local st = num(S[F.state], CLOSED)
if mode == 'open' then
  go(S, c, now, FORCED_OPEN, 'operator forced open', T, 0, ARGV[2])
elseif mode == 'closed' then
  go(S, c, now, FORCED_CLOSED, 'operator forced closed', T, 0, ARGV[2])
elseif mode == 'clear' then
  if st == FORCED_OPEN or st == FORCED_CLOSED then
    go(S, c, now, CLOSED, 'operator cleared override', T, 0, ARGV[2])
  end
elseif mode == 'reset' then
  go(S, c, now, CLOSED, 'operator reset', T, 0, ARGV[2])
  window_clear(S, c)
  for _, k in ipairs({ F.streak, F.rate_limit_streak, F.ramp_start, F.paused_until, F.pause_kind,
    F.half_open_successes, F.slow_tat, F.usage, F.usage_at, F.no_usage_at, F.adaptive_cut_at, F.fast_count,
    F.fast_evidence, F.fast_since, F.next_slot, F.adaptive_last_cut }) do
    set(S, k, 0)
  end
  set(S, F.incident, '')
  set(S, F.pause_reason, '')
  set(S, F.fast_keys, '')
  set(S, F.adaptive, 1)
else
  return redis.error_reply('bad mode')
end
return finish(S, append_number_pause(snapshot(S, c, now), KEYS[3]), T)
