-- A waiter leaves (cancelled, deadline, dwell limit, or refused by its owner's revalidation).
-- If it was granted meanwhile, the grant goes back unused. ARGV from 4: id, reason.
local done, epoch = open_ws(false)
if done then return done end
local id = ARGV[4]
-- A copy of the request's acquire still on its way (sent before a lost answer) takes nothing.
redis.call('SET', BASE .. 't:' .. id, '1', 'PX', PROC_TTL)
-- Acquires look for tombstones only while one may live.
local sw = scope(key_w())
if (sw.tb or 0) < NOW + PROC_TTL then
  sw.tb = NOW + PROC_TTL
  sw._dirty = true
end
local w = waiter(id)
if w ~= nil then
  dequeue(w)
  count(w.prov, 'reject', ARGV[5])
  local ev = evidence(w)
  pump()
  ev.st = 'removed'
  ev.ep = epoch
  return reply(ev)
end
local raw = redis.call('HGET', STATE, lease_field(id))
if raw then
  free_lease(id, cjson.decode(raw), nil, nil, nil, nil)
  pump()
  return reply({st = 'released', ep = epoch})
end
return reply({st = 'gone', ep = epoch})
