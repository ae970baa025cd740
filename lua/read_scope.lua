-- read_scope.lua: reads the current state of a sender scope without changing it.
--
-- KEYS[1]  cfg hash of the scope
-- KEYS[2]  state hash of the scope
-- ARGV[1]  compiled defaults "name=value;..."
-- Returns: { state, incident_id, open_until_ms, calls_in_window, failures_in_window, now_ms, since_ms,
--            paused_until_ms, pause_reason, ramp_fraction (string), trips, tokens (string), usage_percent,
--            trip_streak }

local now = now_ms()
local c = load_cfg(ARGV[1], KEYS[1])
local S = load_state(KEYS[2])
return snapshot(S, c, now)
