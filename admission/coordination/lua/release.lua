-- Give a lease back. ARGV from 9: lease id, success ('1', '0' or ''), retry-after ms, actual
-- tokens, actual cost (each '' when absent).
local done, epoch = open_ws(false)
if done then return done end
local id = ARGV[9]
local raw = redis.call('HGET', LEASES, id)
if not raw then return reply({st = 'gone', ep = epoch}) end
local lease = cjson.decode(raw)
preload('W', 'P:' .. lease.pid, 'V:' .. lease.prov, 'rsv')
local success = nil
if ARGV[10] == '1' then success = true elseif ARGV[10] == '0' then success = false end
RESULT_TRANSITIONS = {}
free_lease(id, lease, success, tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]))
local mine = RESULT_TRANSITIONS
RESULT_TRANSITIONS = {}
pump()
local out = {st = 'released', ep = epoch}
if #mine > 0 then out.tr = mine end
return reply(out)
