-- After the shared state was lost, a process puts back the permits it still holds, before
-- admission resumes. ARGV from 4: JSON list of every lease {id, pid, prov, bud, tok, cost} the
-- process holds in the workspace. A state that survived in part (a replica promoted without the
-- primary's last writes) may still hold leases of this process made before the epoch began that
-- the process gave back meanwhile: those go back to the pool.
local done, epoch = open_ws(false)
if done then return done end
epoch_reasserted()
local restored, dropped = 0, 0
local held = {}
for _, lease in ipairs(cjson.decode(ARGV[4])) do held[lease.id] = lease end
local began = epoch_began()
local stored = all_leases()
for i = 1, #stored, 2 do
  local id = stored[i]
  if held[id] == nil then
    local lease = cjson.decode(stored[i + 1])
    if lease.proc == PROC and lease.off == nil and (lease.at or 0) < began then
      free_lease(id, lease, nil, nil, nil, nil)
      dropped = dropped + 1
    end
  end
end
for _, lease in pairs(held) do
  if redis.call('HEXISTS', STATE, lease_field(lease.id)) == 0 then
    local sv = scope(key_v(lease.prov))
    lease.proc = PROC
    lease.gen = sv.bg or 0
    lease.probe = 0
    lease.at = NOW
    redis.call('HSET', STATE, lease_field(lease.id), cjson.encode(lease))
    for _, s in ipairs({scope(key_p(lease.pid)), scope(key_w()), sv, scope(key_x(lease.prov, lease.pid))}) do
      s.a = s.a + 1
      s._dirty = true
    end
    restored = restored + 1
  end
end
heartbeat()
if dropped > 0 then pump() end
return reply({st = 'ok', ep = epoch, restored = restored, dropped = dropped})
