-- A provider-wide Retry-After pause: starts or extends, never shortens. ARGV from 4: provider,
-- milliseconds.
local done, epoch = open_ws(false)
if done then return done end
local sv = scope(key_v(ARGV[4]))
local until_ms = NOW + tonumber(ARGV[5])
if until_ms > (sv.pz or 0) then
  sv.pz = until_ms
  sv._dirty = true
end
pressure_event(ARGV[4])
return reply({st = 'ok', ep = epoch})
