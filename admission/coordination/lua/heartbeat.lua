-- A live process renews its lease, reaps dead processes and serves workspaces whose time-based
-- wake is due. Global: ARGV[2] is ''. ARGV from 9: JSON {workspace: {provider\tdecision\treason:
-- count}} of decisions made locally since the last heartbeat (they needed no round trip).
local epoch, ready = epoch_check()
if KNOWN_EPOCH ~= '' and KNOWN_EPOCH ~= epoch then
  return cjson.encode({st = 'epoch', ep = epoch})
end
local reborn = heartbeat()
local reaped = reap()
for ws, counts in pairs(cjson.decode(ARGV[9])) do
  use_ws(ws)
  for label, n in pairs(counts) do
    local prov, decision, reason = string.match(label, '^(.*)\t([^\t]*)\t([^\t]*)$')
    if prov ~= nil then count(prov, decision, reason, n) end
  end
end
local due = redis.call('ZRANGEBYSCORE', WAKES, '-inf', string.format('%.17g', NOW), 'LIMIT', 0, 16)
for _, ws in ipairs(due) do
  use_ws(ws)
  pump()
end
flush()
local live = redis.call('ZCOUNT', PROCS, string.format('%.17g', NOW), '+inf')
return cjson.encode({st = 'ok', ep = epoch, nb = reborn, live = live, reaped = reaped,
  ready = max(0, ready - NOW)})
