-- A process takes a grant made for one of its waiters; only then does its call go out. A grant
-- not taken within GRANT_TTL lapses back to the pool (see lapse_grants). ARGV from 4: the id.
local done, epoch = open_ws(false)
if done then return done end
local id = ARGV[4]
local raw = redis.call('HGET', STATE, lease_field(id))
if not raw then return reply({st = 'gone', ep = epoch}) end
local lease = cjson.decode(raw)
if lease.proc ~= PROC then return reply({st = 'gone', ep = epoch}) end
if lease.off ~= nil then
  lease.off = nil
  redis.call('HSET', STATE, lease_field(id), cjson.encode(lease))
  redis.call('ZREM', OFFERS, id)
end
return reply({st = 'taken', ep = epoch})
