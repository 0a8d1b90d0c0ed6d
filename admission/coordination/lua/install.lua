-- Make a profile revision current in the shared state, unless a later one is there already.
-- ARGV from 9: revision, ledger sequence, digest, limits (JSON object field -> limits JSON).
local done, epoch = open_ws(false)
if done then return done end
local seq = tonumber(ARGV[10])
local current = tonumber(redis.call('HGET', PROF, 'pseq'))
if current ~= nil and current > seq then
  return reply({st = 'newer', ep = epoch, rev = redis.call('HGET', PROF, 'rev'), seq = current})
end
if current ~= nil and current == seq then
  if redis.call('HGET', PROF, 'rev') ~= ARGV[9] then
    return reply({st = 'conflict', ep = epoch, rev = redis.call('HGET', PROF, 'rev'), seq = current})
  end
  return reply({st = 'same', ep = epoch})
end
redis.call('DEL', PROF)
-- Written in slices: a profile may name many thousands of principals, and Lua's unpack has a
-- bounded stack.
local fields = {'rev', ARGV[9], 'pseq', ARGV[10], 'dg', ARGV[11]}
for field, value in pairs(cjson.decode(ARGV[12])) do
  fields[#fields + 1] = field
  fields[#fields + 1] = value
  if #fields >= 2000 then
    redis.call('HSET', PROF, unpack(fields))
    fields = {}
  end
end
if #fields > 0 then redis.call('HSET', PROF, unpack(fields)) end
-- Queued work is judged again under the new limits at once.
pump()
return reply({st = 'installed', ep = epoch})
