-- pool_trip.lua: opens one number's breaker on its token's pooled evidence (pool_evidence.lua named it).
--
-- The same CLOSED -> OPEN transition as record_outcomes.lua's own trips (outage_trip in scope_prelude.lua: the
-- cooldown with its growth and jitter, the incident id, the outage's adaptive cuts given back), so the events,
-- metrics, alerts and the HALF_OPEN canary recovery are those of any trip. Only a CLOSED scope trips: OPEN,
-- HALF_OPEN and the FORCED_* states are left as they are (a HALF_OPEN scope's canaries decide for it). An OPEN
-- scope whose cooldown ended moves to HALF_OPEN first, as every scope script does.
--
-- KEYS[1]  cfg hash of the scope
-- KEYS[2]  state hash of the scope
-- ARGV[1]  compiled defaults "name=value;..."
-- ARGV[2]  tag used in minted incident ids (the phone_number_id)
-- ARGV[3]  random number in [0, 1) for cooldown jitter
-- ARGV[4]  reason of the trip
-- Returns: { state, incident_id, open_until_ms, calls_in_window, failures_in_window, now_ms, paused_until_ms,
--            then per transition: from, to, at_ms, reason, incident_id }  (record_outcomes.lua's shape)

local now, c, S = begin()
local tag = ARGV[2]
local rand = num(ARGV[3])
local T = {}
maybe_half_open(S, c, now, T, rand, tag)
if num(S[F.state], CLOSED) == CLOSED then
  outage_trip(S, c, now, ARGV[4] or 'pooled fast trip', T, rand, tag)
end
local out = head(S, c, now)
out[#out + 1] = num(S[F.paused_until])
return finish(S, out, T)
