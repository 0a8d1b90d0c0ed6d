-- Make a profile revision current in the shared state, unless a later one is there already.
-- ARGV from 4: revision, ledger sequence, digest, limits (JSON object field -> limits JSON).
local done, epoch = open_ws(false)
if done then return done end
local seq = tonumber(ARGV[5])
local current = tonumber(redis.call('HGET', PROF, 'pseq'))
if current ~= nil and current > seq then
  return reply({st = 'newer', ep = epoch, rev = redis.call('HGET', PROF, 'rev'), seq = current})
end
if current ~= nil and current == seq then
  if redis.call('HGET', PROF, 'rev') ~= ARGV[4] then
    return reply({st = 'conflict', ep = epoch, rev = redis.call('HGET', PROF, 'rev'), seq = current})
  end
  return reply({st = 'same', ep = epoch})
end
-- The epoch's fields live in the same hash but are not the profile's: they outlive the revision
-- (and, written on this server only, are written again the same way).
local epoch_fields = {}
for _, field in ipairs(redis.call('HKEYS', PROF)) do
  if string.sub(field, 1, 2) == 'e:' then epoch_fields[#epoch_fields + 1] = field end
end
local epoch_values = {}
if #epoch_fields > 0 then epoch_values = redis.call('HMGET', PROF, unpack(epoch_fields)) end
redis.call('DEL', PROF)
-- Written in slices: a profile may name many thousands of principals, and Lua's unpack has a
-- bounded stack.
local fields = {'rev', ARGV[4], 'pseq', ARGV[5], 'dg', ARGV[6]}
for field, value in pairs(cjson.decode(ARGV[7])) do
  fields[#fields + 1] = field
  fields[#fields + 1] = value
  if #fields >= 2000 then
    redis.call('HSET', PROF, unpack(fields))
    fields = {}
  end
end
if #fields > 0 then redis.call('HSET', PROF, unpack(fields)) end
if #epoch_fields > 0 then
  local kept = {}
  for i, field in ipairs(epoch_fields) do
    kept[#kept + 1] = field
    kept[#kept + 1] = epoch_values[i]
  end
  epoch_write(unpack(kept))
end
-- Queued work is judged again under the new limits at once.
pump()
return reply({st = 'installed', ep = epoch})
