-- observe_usage.lua: stores the Meta usage percent of a scope (X-Business-Use-Case-Usage), which admit_send.lua
-- turns into throttle levels (above throttle_slow_percent low priority is slowed; above throttle_pause_percent
-- marketing and replay are paused). Meta's usage is an hourly rolling window, so the reading is trusted for it:
-- it fades linearly to 0 over usage_ttl_ms (default one hour). "none" records that Meta answered without usage
-- headers: the scope is quota blind (F.no_usage_at newer than F.usage_at) until an answer carries them again,
-- and admit_send.lua applies blind_rate_factor meanwhile.
--
-- KEYS[1]  cfg hash of the scope (unused; passed so every scope script has the same key layout)
-- KEYS[2]  state hash of the scope
-- ARGV[1]  usage percent (0..100+), or "none"
-- Returns: the stored usage percent, or -1 for "none"

local now = now_ms()
local S = load_state(KEYS[2])
if ARGV[1] == 'none' then
  set(S, F.no_usage_at, now)
  save_state(S, KEYS[2])
  return -1
end
set(S, F.usage, math.floor(num(ARGV[1])))
set(S, F.usage_at, now)
save_state(S, KEYS[2])
return math.floor(num(ARGV[1]))
