-- A live process renews its lease, reaps dead processes and serves workspaces whose time-based
-- wake is due. Global: ARGV[2] is ''. ARGV from 9: JSON {workspace: {provider\tdecision\treason:
-- count}} of decisions made locally since the last heartbeat (they needed no round trip);
-- JSON {workspace: [waiter id]} of this process's waiters to audit: each one Redis no longer
-- queues comes back as granted (its grant message was lost) or lost (queue it again).
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
  if pump() == nil then redis.call('ZREM', WAKES, ws) end
end
local audit = {}
for ws, ids in pairs(cjson.decode(ARGV[10])) do
  use_ws(ws)
  for _, id in ipairs(ids) do
    if redis.call('HEXISTS', WAITERS, id) == 0 then
      local entry = nil
      local raw = redis.call('HGET', LEASES, id)
      if raw then
        local lease = cjson.decode(raw)
        if lease.proc == PROC then
          entry = evidence({pid = lease.pid, prov = lease.prov})
          entry.t = 'g'
        end
      end
      entry = entry or {t = 'lost'}
      entry.id = id
      entry.ws = ws
      audit[#audit + 1] = entry
    end
  end
end
flush()
local live = redis.call('ZCOUNT', PROCS, string.format('%.17g', NOW), '+inf')
local out = {st = 'ok', ep = epoch, nb = reborn, live = live, reaped = reaped,
  ready = max(0, ready - NOW)}
if #audit > 0 then out.audit = audit end
return cjson.encode(out)
