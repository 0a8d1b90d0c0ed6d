-- After the shared state was lost, a process puts back the permits it still holds, before
-- admission resumes. ARGV from 9: JSON list of leases {id, pid, prov, bud, tok, cost}.
local done, epoch = open_ws(false)
if done then return done end
local restored = 0
for _, lease in ipairs(cjson.decode(ARGV[9])) do
  if redis.call('HEXISTS', LEASES, lease.id) == 0 then
    local sv = scope(key_v(lease.prov))
    lease.proc = PROC
    lease.gen = sv.bg or 0
    lease.probe = 0
    lease.at = NOW
    redis.call('HSET', LEASES, lease.id, cjson.encode(lease))
    for _, s in ipairs({scope(key_p(lease.pid)), scope(key_w()), sv, scope(key_x(lease.prov, lease.pid))}) do
      s.a = s.a + 1
      touch(s)
    end
    restored = restored + 1
  end
end
redis.call('SADD', PFX .. ':pw:' .. PROC, WS)
return reply({st = 'ok', ep = epoch, restored = restored})
