-- tick_scope.lua: moves an OPEN scope to HALF_OPEN once its cooldown ended, even with no traffic, and
-- returns the scope's state. Idempotent: any number of coordinators may tick the same scope; only the first
-- tick after the cooldown makes the transition.
--
-- KEYS[1]  cfg hash of the scope
-- KEYS[2]  state hash of the scope
-- KEYS[3]  the number's pause hash (bw:{<waba>:<phone>}:pause; parent_pause.lua)
-- ARGV[1]  compiled defaults "name=value;..."
-- ARGV[2]  tag used in minted incident ids (the phone_number_id)
-- Returns: the read_scope.lua reply, then per transition: from, to, at_ms, reason, incident_id

local now, c, S = begin()
local T = {}
maybe_half_open(S, c, now, T, 0, ARGV[2])
if num(S[F.ramp_start]) > 0 and ramp_fraction(S, c, now) >= 1 then set(S, F.ramp_start, 0) end
return finish(S, append_number_pause(snapshot(S, c, now), KEYS[3]), T)
