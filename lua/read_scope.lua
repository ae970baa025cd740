-- read_scope.lua: reads the current state of a sender scope without changing it.
--
-- KEYS[1]  cfg hash of the scope
-- KEYS[2]  state hash of the scope
-- KEYS[3]  the number's pause hash (bw:{<waba>:<phone>}:pause; parent_pause.lua)
-- ARGV[1]  compiled defaults "name=value;..."
-- Returns: { state, incident_id, open_until_ms, calls_in_window, failures_in_window, now_ms, since_ms,
--            paused_until_ms, pause_reason, ramp_fraction (string), trips, tokens (string), usage_percent,
--            trip_streak, adaptive_share (string), quota_visibility (1 seen, 0 blind, -1 unknown),
--            next_slot_wait_ms, then the number's pause: paused_until_ms, halted, reason, code, since_ms, source,
--            lift, marketing (append_number_pause in scope_prelude.lua) }

local now, c, S = begin()
return append_number_pause(snapshot(S, c, now), KEYS[3])
