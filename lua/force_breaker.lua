-- force_breaker.lua: operator overrides of a scope's breaker.
--
-- "open" sets FORCED_OPEN (every send denied), "closed" sets FORCED_CLOSED (never trips; limits still
-- apply), "clear" returns a forced scope to CLOSED (with the usual ramp-up), "reset" wipes the window,
-- counters, pause and incident and sets CLOSED without a ramp.
--
-- KEYS[1]  cfg hash of the scope
-- KEYS[2]  state hash of the scope
-- ARGV[1]  compiled defaults "name=value;..."
-- ARGV[2]  tag used in minted incident ids (the phone_number_id)
-- ARGV[3]  mode: "open", "closed", "clear" or "reset"
-- Returns: the read_scope.lua reply, then per transition: from, to, at_ms, reason, incident_id
--          (error "bad mode" for an unknown mode)

local now = now_ms()
local c = load_cfg(ARGV[1], KEYS[1])
local S = load_state(KEYS[2])
local T = {}
local mode = ARGV[3]
local st = num(S.st, CLOSED)
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
  set(S, 'inc', '')
  set(S, 'streak', 0)
  set(S, 'rl', 0)
  set(S, 'rc', 0)
  set(S, 'pu', 0)
  set(S, 'pr', '')
  set(S, 'hs', 0)
  set(S, 'lo', 0)
  set(S, 'us', 0)
  set(S, 'ua', 0)
else
  return redis.error_reply('bad mode')
end
save_state(S, KEYS[2])
return append_transitions(snapshot(S, c, now), T)
