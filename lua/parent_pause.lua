-- parent_pause.lua: the pause of one scope: a phone number, a WABA, an app or an access token.
--
-- Each pause has its own key, so it holds exactly its scope and a script touches one hash slot. The number's
-- key shares the number's hash tag (admit_send.lua reads it in the same call that takes the rate tokens); the
-- others have their own tag, and the breaker client reads them before admitting (cached for parent_refresh_ms,
-- updated at once by the process that records the pause):
--   bw:{<waba>:<phone>}:pause     the number alone: registration, display name, deleted number (33, 131045,
--                                 131037, 133000, 133010, 133015, 133016), maintenance (131057), an
--                                 authentication refusal that proves nothing about the token (bodiless 401/403)
--   bw:{waba:<waba_id>}:pause     every number of the WABA: its budget (80007 / 80008), a restriction (368,
--                                 131031, 131064), billing (131042), marketing disabled (131063, marketing only)
--   bw:{app:<app_id>}:pause       every number on the app: its call budget (4, 17, 32, 613)
--   bw:{tok:<sha256 of the token, first 16 hex>}:halt
--                                 every number on the token (190, 0 with an auth subcode, permission codes) until
--                                 an operator lifts it or the token changes (a new token has another key). The
--                                 token itself never reaches Redis.
-- Fields: PF in scope_prelude.lua. Every pause records its reason and code, its start, its end (a time, or
-- `halted` until lifted), what lifts it and who set it.
--
-- Modes:
--   read    nothing changes
--   pause   a timed pause of ARGV[2] ms (lift "time"), or with lift "probe" a pause that, once the last one is
--           over, doubles its length (up to ARGV[8] ms) while the key lives; after it ends one send probes
--           (admit_send.lua). Pauses never shorten: a pause only extends the time already there, and an untimed
--           hold stays.
--   halt    until lifted (lift "operator" or "new_token"); the key expires after ARGV[2] ms (then the next send
--           probes); ARGV[8] is the retry-after sends get meanwhile
--   clear   an operator lifts it (the key goes)
--
-- KEYS[1]  the pause key
-- ARGV[1]  mode: "read", "pause", "halt" or "clear"
-- ARGV[2]  pause: pause ms; halt: lifetime of the key ms
-- ARGV[3]  reason
-- ARGV[4]  Meta code (0: none)
-- ARGV[5]  source: "answer", "webhook" or "operator"
-- ARGV[6]  lift: pause "time" or "probe"; halt "operator" or "new_token"
-- ARGV[7]  1: marketing messages only
-- ARGV[8]  pause with lift "probe": longest pause ms; halt: retry-after of held sends ms
-- Returns: { now_ms, paused_until_ms (0 none or ended), reason, halted (1 / 0), code, since_ms, source, lift,
--            marketing (1 / 0), retry_ms, probe_at_ms }  (error "bad mode" for an unknown mode)

local now = now_ms()
local key = KEYS[1]
local mode = ARGV[1]

-- Starts a record or keeps the start of the one in force; writes the rest.
local function write(fields)
  local old = redis.call('HMGET', key, PF.paused_until, PF.halted, PF.since)
  local active = num(old[1]) > now or old[2] == '1'
  local since = now
  if active and num(old[3]) > 0 then since = num(old[3]) end
  redis.call('HSET', key, PF.reason, ARGV[3] or '', PF.code, num(ARGV[4]), PF.source, ARGV[5] or 'answer',
    PF.lift, ARGV[6] or 'time', PF.marketing, num(ARGV[7]), PF.since, since, unpack(fields))
end

if mode == 'pause' then
  local ms = math.max(1, num(ARGV[2]))
  local lift = ARGV[6] or 'time'
  local old = redis.call('HMGET', key, PF.paused_until, PF.halted, PF.lift, PF.length)
  if old[2] ~= '1' then
    -- Doubles only once the last pause is over (the probe's answer, or later): the answers of sends already in
    -- flight when it began extend it at most to its own length.
    if lift == 'probe' and old[3] == 'probe' and num(old[1]) <= now then
      ms = math.min(math.max(ms, 2 * num(old[4])), math.max(ms, num(ARGV[8], ms)))
    end
    local until_ms = now + ms
    if until_ms > num(old[1]) then
      write({ PF.paused_until, until_ms, PF.length, ms, PF.probe_at, 0 })
      -- The key outlives the pause by a minute (admission starts the ramp from its end); a probe pause's by its
      -- length more, so the next refusal within that time doubles it.
      local keep = ms + 60000
      if lift == 'probe' then keep = 2 * ms + 60000 end
      redis.call('PEXPIRE', key, keep)
    end
  end
elseif mode == 'halt' then
  write({ PF.halted, 1, PF.retry, math.max(1, num(ARGV[8], 600000)) })
  redis.call('PEXPIRE', key, math.max(1, num(ARGV[2])))
elseif mode == 'clear' then
  redis.call('DEL', key)
elseif mode ~= 'read' then
  return redis.error_reply('bad mode')
end
local h = redis.call('HMGET', key, PF.paused_until, PF.reason, PF.halted, PF.code, PF.since, PF.source, PF.lift,
  PF.marketing, PF.retry, PF.probe_at)
local pu = num(h[1])
if pu <= now then pu = 0 end
return { now, pu, h[2] or '', num(h[3]), num(h[4]), num(h[5]), h[6] or '', h[7] or '', num(h[8]), num(h[9]),
  num(h[10]) }
