-- A live process renews its lease in the workspaces it acts in, reaps dead processes there,
-- and serves those whose time-based wake is due. ARGV[2] is ''; every workspace named lies in the
-- hash slot of the key the caller declared (on a single Redis: any). ARGV from 4:
--   9  JSON {workspace: epoch the caller knows ('' if none)}: renew, reap, pump when due;
--   10 JSON {workspace: {provider\tdecision\treason: count}} of decisions made locally since the
--      last heartbeat (they needed no round trip);
--   11 JSON {workspace: [waiter id]} of this process's waiters to audit: each one Redis no longer
--      queues comes back as granted (its grant message was lost) or lost (queue it again);
--   12 '1' to renew the lease in the deployment's registry (P:{}:procs) and count live processes.
local out = {st = 'ok', reaped = 0}
local spaces = {}
for ws, known in pairs(cjson.decode(ARGV[4])) do
  use_ws(ws)
  local epoch, ready = epoch_check()
  local entry = {ep = epoch, ready = max(0, ready - NOW)}
  entry.nb = heartbeat() and known ~= '' and known == epoch
  out.reaped = out.reaped + reap()
  local wake = tonumber(redis.call('HGET', META, 'wk'))
  if wake ~= nil and wake <= NOW then pump() end
  spaces[ws] = entry
end
out.ws = spaces
for ws, counts in pairs(cjson.decode(ARGV[5])) do
  use_ws(ws)
  for label, n in pairs(counts) do
    local prov, decision, reason = string.match(label, '^(.*)\t([^\t]*)\t([^\t]*)$')
    if prov ~= nil then count(prov, decision, reason, n) end
  end
end
local audit = {}
for ws, ids in pairs(cjson.decode(ARGV[6])) do
  use_ws(ws)
  for _, id in ipairs(ids) do
    if redis.call('HEXISTS', WAITERS, id) == 0 then
      local entry = nil
      local raw = redis.call('HGET', STATE, lease_field(id))
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
if ARGV[7] == '1' then
  local registry = PFX .. ':{}:procs'
  local stamp = string.format('%.17g', NOW)
  redis.call('ZREMRANGEBYSCORE', registry, '-inf', stamp)
  redis.call('ZADD', registry, string.format('%.17g', NOW + PROC_TTL), PROC)
  out.live = redis.call('ZCOUNT', registry, stamp, '+inf')
end
if #audit > 0 then out.audit = audit end
return cjson.encode(out)
