-- observe_usage.lua: stores the Meta usage percent of a scope (X-Business-Use-Case-Usage), which admit_send.lua
-- turns into throttle levels (above throttle_slow_percent low priority is slowed; above throttle_pause_percent
-- marketing and replay are paused); the stored reading fades linearly to 0 over usage_ttl_ms.
--
-- KEYS[1]  cfg hash of the scope (unused; passed so every scope script has the same key layout)
-- KEYS[2]  state hash of the scope
-- ARGV[1]  usage percent (0..100+)
-- Returns: the stored usage percent

local now = now_ms()
local S = load_state(KEYS[2])
set(S, 'us', math.floor(num(ARGV[1])))
set(S, 'ua', now)
save_state(S, KEYS[2])
return math.floor(num(ARGV[1]))
